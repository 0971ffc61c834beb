"""The roofline's bytes (hisparse_jax.bench.roofline): what a step must read and fetch, and the
seconds that takes at given bandwidths."""

from __future__ import annotations

import jax
import pytest

from hisparse_jax.bench import roofline
from hisparse_jax.models import dsa, nsa, quest


def test_step_bytes_of_a_dsa_step():
    config = dsa.Config.tiny(index_dtype="fp8")
    weights = dsa.init_weights(config)
    moved = roofline.step_bytes(dsa, config, weights, batch=3, context=100, misses_per_step=10)
    embed = weights.embed
    assert moved["weights"] == sum(x.nbytes for x in jax.tree.leaves(weights)) - embed.nbytes + 3 * embed.shape[1] * 4
    assert moved["metadata"] == 3 * config.groups * 100 * (config.index_dim + 4)
    assert moved["attended KV"] == config.num_layers * 3 * (config.top_k + 1) * config.record_bytes
    assert moved["miss IO"] == 10 * config.record_bytes


def test_a_step_reads_only_the_experts_it_is_expected_to_use():
    # 8 local experts, 2 per token: batch 1 routes 2 pairs (1.875 experts expected busy of 8),
    # batch 64 routes 128 pairs (all but ~1e-7 of an expert busy).
    config = dsa.Config.tiny(experts=8, experts_per_token=2, expert_d_ff=16, shared_experts=1, expert_groups=2)
    weights = dsa.init_weights(config)
    # the experts' matrices and scales hold 8 routed experts and then the shared one
    experts = sum(x.nbytes for layer in weights.layers for x in jax.tree.leaves(layer.moe.experts))
    routed = experts * 8 / 9
    everything = sum(x.nbytes for x in jax.tree.leaves(weights)) - weights.embed.nbytes
    for batch, busy in ((1, 8 * (1 - (7 / 8) ** 2)), (64, 8 * (1 - (7 / 8) ** 128))):
        want = everything - routed + routed * busy / 8 + batch * weights.embed.shape[1] * 4
        assert roofline.weight_bytes(weights, batch, config) == pytest.approx(want, rel=1e-12)
    assert roofline.weight_bytes(weights, 1, config) < roofline.weight_bytes(weights, 64, config)


@pytest.mark.parametrize("family", [nsa, quest])
def test_metadata_read_grows_with_context(family):
    config = family.Config.tiny()
    assert 0 < family.metadata_bytes_read(config, 64) < family.metadata_bytes_read(config, 128)


def test_roofline_seconds_is_hbm_bytes_over_hbm_plus_miss_io_over_the_host_link():
    moved = {"weights": 6e9, "metadata": 1e9, "attended KV": 1e9, "miss IO": 5e8}
    assert roofline.roofline_seconds(moved, {"hbm": 4e12, "host link": 5e10}) == pytest.approx(8e9 / 4e12 + 5e8 / 5e10)
