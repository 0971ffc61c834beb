"""What the model tests share: one Case per family (its small configs, ragged prompts), cached
end-to-end decode runs, bit equality.

Compiling a decode program is what costs time on CPU, so each (family, config, mode, steps) run is
prefilled and decoded once per session and shared by the tests that compare runs.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from hisparse_jax.models import get_family
from hisparse_jax.models.family import decode_weights
from hisparse_jax.testing import Run, assert_runs_equal, run_decode

STEPS = 64


def make_prompts(seed: int = 0, lengths=(37, 20, 5), T: int = 40, vocab: int = 256):
    """[b, T] int32 prompts (random tokens past each length too) and lengths [b], as NumPy."""
    rng = np.random.default_rng(seed)
    prompts = rng.integers(0, vocab, (len(lengths), T)).astype(np.int32)
    return prompts, np.asarray(lengths, np.int32)


@functools.cache
def weights_for(family: str, config: Any, seed: int = 0):
    """family.init_weights(config, seed) in the family's decode layout (Family.decode_weights: the
    layout the decode benchmark runs; DSA's merged input projections), cached. Its values depend on
    the weight shapes and the seed only, so configs differing in cache fields (top_k, hot_slots,
    ...) get equal weights."""
    f = get_family(family)
    return decode_weights(f, config, f.init_weights(config, seed))


@functools.cache
def decode_run(family: str, config: Any, mode: str, steps: int, lengths: tuple, T: int, selections=None) -> Run:
    """testing.run_decode of make_prompts(0, lengths, T), cached: `steps` greedy tokens with logits.
    `selections`: a hashable (bytes, shape) of forced ids, or None."""
    prompts, lens = make_prompts(0, lengths, T)
    forced = None if selections is None else np.frombuffer(selections[0], np.int32).reshape(selections[1])
    return run_decode(family, config, weights_for(family, config), mode, prompts, lens, steps, forced)


# Tokens and every logit bit equal, zero tolerance (the package's check, named as the tests know it).
assert_bitwise_equal = assert_runs_equal


@dataclasses.dataclass(frozen=True)
class Case:
    """One family's end-to-end test setup.

    Attributes:
      family: the family name.
      lengths: ragged prompt lengths of the batch; T: the prompt buffer (room for every decoded
        token too, for the decode-vs-prefill test).
      base: tiny-preset overrides of the evicting config (k < B < records).
      every_record: overrides making top_k cover every record of max_context.
    """

    family: str
    lengths: tuple[int, ...]
    T: int
    base: dict
    every_record: dict

    @property
    def module(self):
        return get_family(self.family)

    @property
    def k(self) -> int:
        return self.base["top_k"]

    def config(self, **overrides):
        return self.module.Config.tiny(**{**self.base, **overrides})

    def run(self, config, mode: str, steps: int = STEPS, selections: np.ndarray | None = None) -> Run:
        key = None if selections is None else (np.ascontiguousarray(selections, np.int32).tobytes(), selections.shape)
        return decode_run(self.family, config, mode, steps, self.lengths, self.T, key)

    def weights(self, config=None):
        return weights_for(self.family, config or self.config())

    def prompts(self):
        return make_prompts(0, self.lengths, self.T)

    def device_baseline(self) -> Run:
        # "device" mode has no hot buffer and never reads hot_slots: this run is the baseline of
        # every hot_slots value (one compile instead of one per B).
        return self.run(self.config(), "device")


CASES = {
    # k = 8, B = 10: a few spare slots, so LRU evicts every step.
    "dsa": Case("dsa", (37, 20, 5), 40, dict(num_layers=2, top_k=8, hot_slots=10),
                dict(max_context=128, top_k=128, hot_slots=128)),
    # l=8, d=4, l'=16, w=32; 16 blocks; top-n = 4: the initial, the latest sealed, one scored, the open block.
    "nsa": Case("nsa", (170, 101, 37), 240, dict(top_k=3, hot_slots=5), dict(top_k=16, hot_slots=16)),
    # 2 dense + 2 sparse layers, 16 pages of 16.
    "quest": Case("quest", (170, 101, 37), 240, dict(top_k=4, hot_slots=6), dict(top_k=16, hot_slots=16)),
}

# The fewest layers of each family that still run every kind of layer (Quest: one dense-attention
# and one sparse layer): shorter compilations for tests about a layer's parts (e.g. the MoE).
FEW_LAYERS = {
    "dsa": dict(num_layers=1),
    "nsa": dict(num_layers=1),
    "quest": dict(num_layers=2, dense_layers=1),
}
