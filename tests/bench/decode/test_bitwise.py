"""`hisparse-bench bitwise` (hisparse_jax.bench.decode.bitwise) on a tiny CPU shape: HiSparse and
full-KV decode the same tokens and logits, bit for bit, and the summary says so."""

from __future__ import annotations

import json

import jax
import pytest

from hisparse_jax.bench import cli
from hisparse_jax.bench.decode import bitwise
from hisparse_jax.bench.errors import BenchError
from hisparse_jax.models import get_family

TINY = ["--preset", "tiny", "--context", "200", "--batch", "2", "--steps", "4", "--reps", "2", "--num-layers", "2"]


def test_tiny_shape_is_bitwise_equal(tmp_path, capsys):
    path = tmp_path / "bitwise.json"
    assert cli.main(["bitwise", *TINY, "--json", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(path.read_text())
    assert printed["tokens_equal"] and printed["logits_equal"]
    assert printed["pool_memory_kind"] == "pinned_host"
    assert (printed["context"], printed["batch"], printed["steps"], printed["layers"]) == (200, 2, 4, 2)
    assert 0.0 <= printed["hisparse_miss_rate_after_first_step"] <= 1.0
    assert printed["hisparse_step_ms"] > 0 and printed["device_step_ms"] > 0


def test_prompts_are_ragged_and_room_is_left_for_every_call():
    family = get_family("dsa")
    config = bitwise.bitwise_config(family, "tiny", 200, 4, 2, 2)
    assert config.max_context > 200 + 4 * 4  # compared call, untimed call, 2 timed calls
    prompts, lengths = bitwise.ragged_prompts(config, 3, 200)
    assert prompts.shape == (3, 200) and lengths.tolist() == [200, 103, 6]
    with pytest.raises(BenchError, match="would hold"):
        bitwise.ragged_prompts(config, 4, 200)


def test_a_preset_that_cannot_be_built_is_a_one_line_error(one_line_error):
    # Quest keeps its first two layers dense: two layers leave no sparse one.
    err = one_line_error(["bitwise", "--family", "quest", *TINY])
    assert err.startswith("hisparse-bench: error: --preset tiny --num-layers 2")


def test_a_context_too_short_for_the_top_k_names_context(one_line_error):
    # dsa/tiny selects 16 pages: 5 tokens of context leave far fewer pages than that.
    err = one_line_error(["bitwise", "--preset", "tiny", "--context", "5", "--steps", "1", "--reps", "1"])
    assert err.startswith("hisparse-bench: error: --preset tiny --context 5 --steps 1 --reps 1 (max_context")


def test_modes_that_differ_are_one_line_naming_full_kv_and_exit_1(tmp_path, capsys, monkeypatch):
    # A difference cannot be provoked honestly at a tiny shape, so the comparison's summary is given.
    summary = dict(tokens_equal=True, logits_equal=False, hisparse_step_ms=1.0, device_step_ms=1.0)
    monkeypatch.setattr(bitwise, "compare", lambda args: summary)
    assert cli.main(["bitwise", *TINY, "--json", str(tmp_path / "b.json")]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out) == summary == json.loads((tmp_path / "b.json").read_text())
    assert captured.err == "hisparse-bench: error: hisparse and full-KV decodes differ\n"


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU cannot run bf16 dots; GPUs can")
def test_bfloat16_is_refused_on_cpu_like_decode(one_line_error, monkeypatch):
    """The default preset (realistic, bfloat16) was an XLA UNIMPLEMENTED traceback after minutes."""
    monkeypatch.setattr(bitwise, "decode_mode", lambda *a, **k: pytest.fail("decoded a bfloat16 config on XLA:CPU"))
    err = one_line_error(["bitwise"])
    assert err == ("hisparse-bench: error: the dsa realistic config computes in bfloat16, which XLA:CPU cannot run (it "
                   "has no bf16 x bf16 -> f32 dot); pass --preset tiny, or run on a GPU\n"), err


@pytest.mark.parametrize("context, batch", [("1073741824", "64"), ("100000000", "1000")])
def test_a_shape_beyond_memory_is_refused_before_allocating(context, batch, one_line_error, monkeypatch):
    """--context 2^30 and --batch 1000 --context 100000 were NumPy MemoryError tracebacks: the arrays are sized
    from the config first (both far beyond any machine's memory here)."""
    monkeypatch.setattr(bitwise, "ragged_prompts", lambda *a, **k: pytest.fail("allocated the prompts"))
    err = one_line_error(["bitwise", "--preset", "tiny", "--context", context, "--batch", batch, "--steps", "1",
                          "--reps", "1", "--num-layers", "1"])
    assert f"--context {context} --batch {batch} --num-layers 1: the comparison needs at least" in err, err
    assert "lower --context, --batch or --num-layers" in err, err


def test_the_memory_needed_is_the_states_bytes():
    family = get_family("dsa")
    config = bitwise.bitwise_config(family, "tiny", 200, 4, 2, 2)
    need = bitwise.memory_needed(family, config, 2, 200, 4)
    from hisparse_jax.bench.decode.capacity import account
    for mode, name in (("hisparse", "hisparse"), ("device", "full-KV")):
        state = account(family, config, 2, mode)
        assert need[mode]["device"][f"the {name} state on the device"] == state.total("device")
        assert need[mode]["host"][f"the {name} host pool"] == state.total("host")
    assert need["hisparse"]["host"]["the hisparse host pool"] > 0 == need["device"]["host"]["the full-KV host pool"]
