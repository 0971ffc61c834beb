"""Which recorded golden bits a host compares against: XLA:CPU rounds differently on another CPU.

The golden tests (tests/models/test_dsa_golden.py, tests/train/test_dsa_training_golden.py)
compare today's code with float32 bits that main's pre-kit DSA wrote. Those bits belong to the
machine that wrote them: XLA:CPU compiles for the host, and its dot kernels pick their code by
the CPU's instruction sets at run time, so another kind of CPU rounds the logits a few ulps
apart. No XLA flag brings two kinds together (`--xla_cpu_max_isa`, turning the XNN or YNN
fusions off: tried on an Intel Xeon with AVX-512 FP16 and AMX against sets from an earlier CI
host). So each recorded set carries its host's fingerprint: a hash of the bits of a few small
computations of the kinds the models run (matmuls of several contraction lengths, a batched
einsum, a bfloat16 matmul, reductions, the transcendentals of softmax, RMSNorm, SiLU and rope),
compiled on the CPU with fixed options at both optimization levels the suite uses, so jax's
settings (jax_disable_most_optimizations, the default matmul precision) do not move it. XLA_FLAGS
do (`--xla_cpu_enable_fast_math`, say): a host is named as it runs under the flags it has.

A test compares, with zero tolerance, against the set recorded on a host with this fingerprint
and this jax. The first sets were written before fingerprints existed and carry none
("unrecorded host"): a host matching no fingerprint compares against them. There a difference in
float outputs skips, naming the host's fingerprint and tests/record_goldens.sh, since it cannot
tell a bug from another CPU's rounding; integer outputs (tokens, selected ids) must still match,
as they did on both kinds of CPU seen, whose logits differ by ulps only.
tests/record_goldens.sh records this host's sets from the pre-kit commit.

Recorders import this file by its path with main's old package installed, so it imports
nothing of hisparse_jax.
"""

from __future__ import annotations

import functools
import hashlib
import platform
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

# Main's DSA before the research kit rebuilt it (tests/record_goldens.sh builds and runs it).
PRE_KIT_COMMIT = "3cf9b245567e305a47f02c9397e98344958ed713"
RECORD_COMMAND = "tests/record_goldens.sh"

# Both levels the suite compiles at: tests/models/conftest.py turns most optimizations off for
# the process (what jax_disable_most_optimizations sets), a file run alone keeps them on.
_LEVELS = ({"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True},
           {"xla_backend_optimization_level": 3, "xla_llvm_disable_expensive_passes": False})


def _probe_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2026)

    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    return dict(a=normal(16, 64), b=normal(64, 48), c=normal(8, 256), d=normal(256, 32), e=normal(4, 1024),
                f=normal(1024, 8), q=normal(2, 8, 32), k=normal(2, 40, 32), x=normal(1000), y=normal(24, 96))


def _probe(i: dict) -> list:
    hi = lax.Precision.HIGHEST
    y = i["y"]
    rms = y * lax.rsqrt(jnp.mean(y * y, axis=-1, keepdims=True) + 1e-6)
    return [
        jnp.matmul(i["a"], i["b"], precision=hi),
        jnp.matmul(i["c"], i["d"], precision=hi),
        jnp.matmul(i["e"], i["f"], precision=hi),
        jnp.einsum("bqd,bkd->bqk", i["q"], i["k"], precision=hi),
        jnp.matmul(i["a"].astype(jnp.bfloat16), i["b"].astype(jnp.bfloat16), preferred_element_type=jnp.float32),
        jnp.sum(i["x"]),
        jnp.sum(y, axis=-1),
        jax.nn.softmax(y, axis=-1),
        jax.nn.logsumexp(y, axis=-1),
        rms,
        jax.nn.silu(y),
        jnp.tanh(y),
        jnp.log1p(jnp.abs(y)),
        jnp.sin(10.0 * y) * jnp.cos(10.0 * y),
    ]


@functools.cache
def fingerprint() -> str:
    """12 hex digits naming how XLA:CPU rounds on this host (the same in every process here, on
    the CPU whatever the default backend)."""
    inputs = jax.device_put(_probe_inputs(), jax.devices("cpu")[0])
    digest = hashlib.sha256()
    for options in _LEVELS:
        compiled = jax.jit(_probe).lower(inputs).compile(compiler_options=options)
        for out in compiled(inputs):
            digest.update(np.asarray(out).tobytes())
    return digest.hexdigest()[:12]


def describe_host() -> str:
    """The CPU in words, for a recorded set and a skip message."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "model name":
                model = value
            elif key in ("flags", "Features"):
                flags = [f for f in value.split() if f.startswith(("avx", "amx", "fma", "sve", "asimd"))]
    except OSError:  # not Linux: the model alone
        pass
    return f"{model} ({platform.machine()}; {' '.join(sorted(set(flags))) or 'flags unknown'})"


class Choice:
    """The set a host compares against, and what a difference means there."""

    def __init__(self, recorded: dict, exact_host: bool):
        self.recorded = recorded
        self.exact_host = exact_host  # recorded on a host with this fingerprint

    def differs(self, line: str, *, on_every_host: bool = False) -> None:
        """A difference: a failure against this host's own set, or in what every host must give
        alike (`on_every_host`: integer outputs); a skip against the unrecorded set otherwise."""
        if self.exact_host or on_every_host:
            raise AssertionError(line)
        import pytest
        pytest.skip(f"no golden set was recorded on a host like this one (fingerprint {fingerprint()}, "
                    f"{describe_host()}) and the unrecorded host's set differs here ({line}): XLA:CPU may "
                    f"round differently on this CPU; record this host's sets with `{RECORD_COMMAND}`")


def choose(sets: list[dict], what: str) -> Choice:
    """The set of `sets` (each with "fingerprint", None when unrecorded, and "jax_version") this
    host compares against; skips when none was written by this jax."""
    import pytest
    mine = [s for s in sets if s.get("jax_version") == jax.__version__]
    if not mine:
        versions = sorted({str(s.get("jax_version")) for s in sets})
        pytest.skip(f"the {what} goldens were written by jax {', '.join(versions)}; this is jax {jax.__version__}, "
                    f"whose XLA may round differently: record them with `{RECORD_COMMAND}`")
    here = fingerprint()
    for recorded in mine:
        if recorded.get("fingerprint") == here:
            return Choice(recorded, True)
    for recorded in mine:
        if recorded.get("fingerprint") is None:
            return Choice(recorded, False)
    pytest.skip(f"no {what} golden set was recorded on a host like this one (fingerprint {here}, {describe_host()}): "
                f"record one with `{RECORD_COMMAND}`")


if __name__ == "__main__":
    import sys

    # --pre-kit-commit: the commit tests/record_goldens.sh builds; otherwise this host's fingerprint.
    print(PRE_KIT_COMMIT if sys.argv[1:] == ["--pre-kit-commit"] else f"{fingerprint()} {describe_host()}")
