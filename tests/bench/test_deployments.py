"""Deployment slices: the derivation's arithmetic, its errors, the CLI's use of it, and every
slice's structure decoding alike in "hisparse" and "device" mode at tiny sizes."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

from hisparse_jax.bench import cli, deployments
from hisparse_jax.bench.decode import plan, report
from hisparse_jax.bench.decode.plan import build_plan
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.models import get_family

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the model tests' cached decode runs
from model_helpers import CASES, assert_bitwise_equal, decode_run  # noqa: E402


def test_glm5_derivation_by_hand():
    d = deployments.get_deployment("glm5-h200").derive()
    routed = 75 * 256 * 3 * 6144 * 2048  # MoE layers x experts x (gate, up, down) x d_model x expert_d_ff
    assert d.routed_weight_bytes_per_gpu == pytest.approx(routed / 8)  # fp8: one byte per parameter
    assert d.replicated_weight_bytes == pytest.approx(744e9 - routed)
    weights = routed / 8 + 744e9 - routed
    assert d.weight_bytes_per_gpu == pytest.approx(weights)
    assert d.free_bytes_per_gpu == pytest.approx(141e9 - weights)
    assert d.free_bytes_per_layer == pytest.approx((141e9 - weights) / 78)
    assert d.device_budget == int((141e9 - weights) * 8 / 78)
    # The published cross-check: ~240 GB of KV over 8 GPUs is ~30 GB per GPU, all that is left
    # after weights, activations and graphs; the derivation leaves a little more for the latter.
    assert 30e9 < d.free_bytes_per_gpu < 33e9
    assert d.vocab == round(154880 * 8 / 78 / 128) * 128 == 15872  # the share, in whole 128-column blocks
    assert d.overrides["num_layers"] == 8 and d.overrides["experts"] == 256 // 8


@pytest.mark.parametrize("name", list(deployments.DEPLOYMENTS))
def test_every_deployment_derives_a_positive_budget_and_per_gpu_experts(name):
    dep = deployments.get_deployment(name)
    d = dep.derive()
    assert 0 < d.device_budget < dep.hbm_bytes
    assert d.overrides["experts"] * dep.expert_parallel == dep.card.experts
    assert d.overrides["expert_groups"] == dep.expert_parallel
    assert d.overrides["experts_per_token"] == dep.card.experts_per_token
    assert d.overrides["expert_d_ff"] == dep.card.expert_d_ff and d.overrides["d_model"] == dep.card.d_model
    text = "\n".join(d.lines())
    assert dep.card.name in text and "per layer" in text


def test_layers_scale_the_budget_and_the_vocabulary():
    dep = deployments.get_deployment("dsv32-h200")
    four, eight = dep.derive(4), dep.derive(8)
    assert eight.device_budget == pytest.approx(2 * four.device_budget, abs=1)
    assert eight.vocab == pytest.approx(2 * four.vocab, abs=deployments.VOCAB_MULTIPLE)
    assert eight.vocab % deployments.VOCAB_MULTIPLE == four.vocab % deployments.VOCAB_MULTIPLE == 0
    with pytest.raises(ValueError, match="1 to 61 layers"):
        dep.derive(62)


def test_unknown_deployment_is_an_error():
    with pytest.raises(ValueError, match="deployments: glm5-h200"):
        deployments.get_deployment("glm6")


@pytest.mark.parametrize("argv, message", [
    (["--deployment", "glm5-h200", "--family", "nsa"], "--family nsa: --deployment glm5-h200 sets the model"),
    (["--deployment", "glm5-h200", "--num-layers", "100"], "--num-layers: deployment glm5-h200: a slice has 1 to 78"),
])
def test_deployment_argument_errors(argv, message):
    args = cli.parser().parse_args(["decode", *argv])
    with pytest.raises(BenchError, match=message):
        build_plan(args)


def test_unknown_deployment_name_is_a_one_line_cli_error(capsys):
    assert cli.main(["decode", "--deployment", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--deployment" in err and "glm5-h200" in err and err.count("\n") == 1


# --------------------------------------------------------------------------- tiny variants

TINY_CONTEXT = 256
TINY_STEPS = 8


def _tiny_top_k(o: dict) -> int:
    # A quarter of the records at most, so that prompts of the model tests overflow the hot buffer.
    return min(8, TINY_CONTEXT // o.get("page_size", 1) // 4)


def _tiny_experts(o: dict) -> int:
    # Twice the experts a token needs over the groups: routing still chooses among experts.
    return min(o["experts"], max(4, 2 * math.ceil(o["experts_per_token"] / o["expert_groups"])))


def _tiny_heads(o: dict) -> int:
    # GQA keeps its query heads per KV head (the group the attention shares a record across).
    return _tiny_kv_heads(o) * (o["n_heads"] // o["n_kv_heads"]) if "n_kv_heads" in o else 4


def _tiny_kv_heads(o: dict) -> int:
    return min(2, o["n_kv_heads"])


# The size fields a tiny variant shrinks, each to a CPU-test value computed from the derived
# fields.
SHRINK = {
    "vocab": lambda o: 256,
    "d_model": lambda o: 64,
    "num_layers": lambda o: 2,
    "d_ff": lambda o: 128,
    "n_heads": _tiny_heads,
    "n_kv_heads": _tiny_kv_heads,
    "head_dim": lambda o: 16,
    "qk_nope_dim": lambda o: 16,
    "v_head_dim": lambda o: 16,
    "qk_rope_dim": lambda o: 8,
    "kv_lora_rank": lambda o: 32,
    "q_lora_rank": lambda o: 32 if o["q_lora_rank"] > 0 else 0,  # the query LoRA stays on or off
    "index_heads": lambda o: 4,
    "index_dim": lambda o: 16,  # fp8 index keys need a multiple of 16
    "experts": _tiny_experts,
    "expert_d_ff": lambda o: 16,
    "top_k": _tiny_top_k,
    "hot_slots": lambda o: _tiny_top_k(o) * o["hot_slots"] // o["top_k"],  # B / k kept
    "prefill_chunk": lambda o: 64,
}
# The structure of a slice, kept as derived: the expert routing, the fp8 expert weights and index
# keys, the page size, the dense layers.
KEPT = frozenset({"experts_per_token", "expert_groups", "shared_experts", "routed_scaling", "expert_dtype",
                  "index_dtype", "page_size", "dense_layers"})
# XLA:CPU cannot run DSA's bfloat16 prefill (its absorbed query is a batched bf16 x bf16 -> f32
# matmul that its DotThunk lacks); Quest's bfloat16 runs there and stays.
CPU_DTYPE = {"dsa": "float32"}


def tiny_variant(family: str, overrides: dict) -> dict:
    """The slice's Config fields at CPU-test sizes: the SHRINK fields shrunk, the dtype made one
    XLA:CPU runs, every other field as derived, max_context set (the bench sets it per context)."""
    unknown = sorted(set(overrides) - set(SHRINK) - KEPT - {"dtype"})
    assert not unknown, (f"derived field(s) {', '.join(unknown)} are neither shrunk nor kept: add each to "
                         "SHRINK or KEPT")
    tiny = {name: SHRINK[name](overrides) if name in SHRINK else value for name, value in overrides.items()}
    if family in CPU_DTYPE:
        tiny["dtype"] = CPU_DTYPE[family]
    return {**tiny, "max_context": TINY_CONTEXT}


def _tiny_config(dep: deployments.Deployment):
    """The tiny variant built as the bench builds a slice: the realistic preset plus overrides."""
    overrides = dep.derive().overrides
    tiny = tiny_variant(dep.family, overrides)
    family = get_family(dep.family)
    # Every field the realistic preset sets is overridden: no realistic size leaks into the variant
    # (but d_ff, the dense MLP's width, which a model with experts does not use).
    unused = {"d_ff"} if tiny.get("experts", 0) > 0 else set()
    assert set(family.Config.PRESETS["realistic"]) - unused <= set(tiny)
    return overrides, family.Config.preset("realistic", **tiny)


@pytest.mark.parametrize("name", list(deployments.DEPLOYMENTS))
def test_each_slice_builds_as_a_tiny_scaled_variant(name):
    dep = deployments.get_deployment(name)
    derived, config = _tiny_config(dep)
    for field in KEPT & set(derived):
        assert getattr(config, field) == derived[field], field
    if dep.family not in CPU_DTYPE:
        assert config.dtype == derived["dtype"]
    assert config.experts > 0 and config.experts_per_token < config.experts * config.expert_groups
    if "q_lora_rank" in derived:
        assert (config.q_lora_rank > 0) == (derived["q_lora_rank"] > 0)
    if "n_kv_heads" in derived:
        assert config.n_heads // config.n_kv_heads == derived["n_heads"] // derived["n_kv_heads"]
    case = CASES[dep.family]  # the family's ragged prompts and buffer
    hisparse = decode_run(dep.family, config, "hisparse", TINY_STEPS, case.lengths, case.T)
    assert_bitwise_equal(hisparse, decode_run(dep.family, config, "device", TINY_STEPS, case.lengths, case.T))
    assert hisparse.misses.any(), "nothing evicted: the comparison would not exercise the hot buffer"


def _set_flags(dep: deployments.Deployment) -> list[str]:
    """--set FIELD=VALUE for the tiny variant's shrunk fields (num_layers by --num-layers and
    max_context by --contexts, as the bench sets them), float32 (the bench refuses bfloat16 on
    XLA:CPU)."""
    tiny = tiny_variant(dep.family, dep.derive().overrides)
    shrunk = {name: tiny[name] for name in SHRINK if name in tiny and name != "num_layers"}
    return [f"{name}={value}" for name, value in {**shrunk, "dtype": "float32"}.items()]


@pytest.mark.parametrize("name", list(deployments.DEPLOYMENTS))
def test_explain_plans_the_tiny_variant_of_each_slice(name, capsys):
    dep = deployments.get_deployment(name)
    argv = ["decode", "--deployment", name, "--explain", "--num-layers", "2", "--contexts", "64",
            "--steps", "2", "--reps", "1", "--max-batch", "2", "--host-budget-gib", "1", "--modes", "hisparse",
            "--set", *_set_flags(dep)]
    assert cli.main(argv) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith(f"{name}: {dep.title}\n") and "slice weights per layer:" in out
    assert f"slice: 2 layers, vocab {dep.derive(2).vocab}" in out
    # HiSparse alone: planning the full-KV mode too doubles the compilations and adds no path of the slice.
    runs = next(line for line in out.splitlines() if line.startswith("context 64: runs "))
    assert runs == "context 64: runs " + "; ".join(
        f"capacity {report.MODE_NAMES['hisparse']} batch 2 ({trace})" for trace in plan.DEPLOYMENT_DEFAULTS["trace"])
