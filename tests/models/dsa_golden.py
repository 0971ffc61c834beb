"""DSA's decode outputs before the family was rebuilt on the research kit (hisparse_jax.kit), and
the runs that reproduce them: the kit's DSA must give these tokens, logits and selected ids bit
for bit (tests/models/test_dsa_golden.py).

The file tests/data/dsa_golden.npz was written by main's DSA (commit 186b06d, before the
refactor) with
    python tests/models/dsa_golden.py tests/data/dsa_golden.npz
under the model tests' XLA settings (most optimizations off, float32 matmuls at full
precision: tests/models/conftest.py), on XLA:CPU. Bits depend on the jax version and the
backend, so the test skips under another jax version (it names both).
"""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np

COMMAND = "python tests/models/dsa_golden.py tests/data/dsa_golden.npz"
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


def main(path: str) -> None:
    settings()
    arrays = {"jax_version": np.asarray(jax.__version__), "command": np.asarray(COMMAND)}
    for name, (_, modes) in CASES.items():
        for mode in modes:
            for key, value in run(name, mode).items():
                arrays[f"{name}/{mode}/{key}"] = value
    np.savez_compressed(path, **arrays)


if __name__ == "__main__":
    main(sys.argv[1])
