"""DSA's decode outputs before the family was rebuilt on the research kit (hisparse_jax.kit), and
the runs that reproduce them: the kit's DSA must give these tokens, logits and selected ids bit
for bit (tests/models/test_dsa_golden.py).

tests/data/dsa_golden/ holds one set a host and jax, FINGERPRINT-jaxVERSION.npz, written by
main's DSA at the pre-kit commit (tests/golden_hosts.py's PRE_KIT_COMMIT) on a host whose XLA:CPU
rounds as `golden_hosts.fingerprint()` says, under the model tests' XLA settings (most optimizations off,
float32 matmuls at full precision: tests/models/conftest.py). tests/record_goldens.sh builds that
commit and runs this file with it:
    python tests/models/dsa_golden.py tests/data/dsa_golden
unrecorded-host.npz was written on 2026-12-04, before sets named their host; CI's machines matched
it until 2026-12-06, when one of another CPU (Intel Xeon, AVX-512 FP16 and AMX) did not.
Bits depend on the jax version too, so a set also names the jax that wrote it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

STEPS = 4
LENGTHS = (29, 11)
T = 32

# Tiny DSA configs covering every branch of the indexer and the model: index_share 1 and 2,
# page_size 1 and 4, fp8 index keys, rope in the indexer, the low-rank query, experts.
CASES = {
    "plain": (dict(num_layers=2, top_k=8, hot_slots=10), ("hisparse", "device", "dense")),
    "shared-paged-fp8-rope": (dict(num_layers=4, index_share=2, page_size=4, top_k=3, hot_slots=5,
                                   index_dtype="fp8", index_rope_dim=8), ("hisparse", "dense")),
    "experts-qlora": (dict(num_layers=2, top_k=8, hot_slots=10, experts=4, experts_per_token=2, expert_d_ff=32,
                           shared_experts=1, q_lora_rank=16), ("hisparse", "dense")),
}


def settings() -> None:
    """The model tests' XLA settings (tests/models/conftest.py), before anything compiles."""
    jax.config.update("jax_disable_most_optimizations", True)
    jax.config.update("jax_default_matmul_precision", "highest")


def prompts():
    rng = np.random.default_rng(25)
    return rng.integers(0, 256, (len(LENGTHS), T)).astype(np.int32), np.asarray(LENGTHS, np.int32)


def run(name: str, mode: str) -> dict[str, np.ndarray]:
    """Prefill + STEPS greedy steps of CASES[name] in `mode`: prefill logits, tokens, logits and
    (outside "dense") the ids every selecting layer attended to."""
    from hisparse_jax import decode
    from hisparse_jax.models import dsa

    overrides, _ = CASES[name]
    config = dsa.Config.tiny(**overrides)
    weights = dsa.FAMILY.init_weights(config, 0)
    tokens, lengths = prompts()
    state = dsa.FAMILY.init_state(config, len(LENGTHS), mode)
    state, prefill_logits = decode.prefill(dsa.FAMILY, config, weights, state, jnp.asarray(tokens),
                                           jnp.asarray(lengths))
    first = jnp.argmax(prefill_logits, axis=-1).astype(jnp.int32)
    out = decode.generate(dsa.FAMILY, config, weights, state, first, STEPS, return_logits=True,
                          record_selection=mode != "dense")
    got = dict(prefill_logits=np.asarray(prefill_logits), tokens=np.asarray(out.tokens),
               logits=np.asarray(out.logits))
    if mode != "dense":
        got["selections"] = np.asarray(out.selections)
    return got


def load_sets(folder: Path) -> list[dict]:
    """Every recorded set in `folder`: its arrays, plus "fingerprint" (None where unrecorded) and
    "jax_version"."""
    sets = []
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as data:
            recorded = {key: data[key] for key in data.files}
        recorded["jax_version"] = str(recorded["jax_version"])
        recorded["fingerprint"] = str(recorded["fingerprint"]) if "fingerprint" in recorded else None
        recorded["path"] = path
        sets.append(recorded)
    return sets


def main(folder: str) -> None:
    """Writes FOLDER/FINGERPRINT-jaxVERSION.npz: this host's outputs of the installed hisparse_jax."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # golden_hosts, whichever package is installed
    import golden_hosts

    settings()
    arrays = {"jax_version": np.asarray(jax.__version__), "fingerprint": np.asarray(golden_hosts.fingerprint()),
              "host": np.asarray(golden_hosts.describe_host()), "command": np.asarray(golden_hosts.RECORD_COMMAND)}
    for name, (_, modes) in CASES.items():
        for mode in modes:
            for key, value in run(name, mode).items():
                arrays[f"{name}/{mode}/{key}"] = value
    path = Path(folder) / f"{golden_hosts.fingerprint()}-jax{jax.__version__}.npz"
    np.savez_compressed(path, **arrays)
    print(f"wrote {path}")


if __name__ == "__main__":
    main(sys.argv[1])
