"""`hisparse-bench decode --selection recorded --trace-file PATH`: a recorded selection trace
(hisparse_jax.selection.recorded) replayed as the selection of the timed decode, on the tiny presets.

The trace is mapped onto the model (selecting layer g of G -> trace layer g * L // G, stream i ->
trace stream i mod S, the same ids for every KV head), checked before anything compiles, and the
misses the hisparse runs report are what RESOLVE gives when the mapped ids are replayed through it
from an empty hot buffer."""

from __future__ import annotations

import json

import jax.numpy as jnp
from pathlib import Path

import numpy as np
import bad_npz
import pytest

import hisparse_jax as hs
from hisparse_jax.bench import cli
from hisparse_jax.bench.decode import plan
from hisparse_jax.bench.decode.runner import RecordedSelection, tokens_needed, trace_ids
from hisparse_jax.bench.decode.working_memory import trace_ids_bytes
from hisparse_jax.models import get_family
from hisparse_jax.selection.recorded import RecordedTrace, save_trace

STEPS, REPS = 2, 3  # a run decodes STEPS x (REPS + 1) steps: 8
FAST = ["--steps", str(STEPS), "--reps", str(REPS), "--max-batch", "3", "--device-budget-mib", "0.5", "--no-plots"]
SOURCE = {"model": "hand-made", "seed": 0}


def _trace(sealed: np.ndarray, layers: int, k: int, page_size: int = 1, seed: int = 0) -> RecordedTrace:
    """Selections of `k` distinct ids among each stream's sealed records (ascending, -1 padded
    where fewer than k are sealed), each keeping a random share of the ids the same layer and
    stream selected the step before: locality that differs from step to step, layer to layer and
    stream to stream, so that a replay of another step or stream counts other misses."""
    rng = np.random.default_rng(seed)
    steps, streams = sealed.shape
    ids = np.full((steps, layers, streams, k), -1, np.int32)
    for t in range(steps):
        for layer in range(layers):
            for s in range(streams):
                before = ids[t - 1, layer, s] if t else ids[0, layer, s]
                before = before[before >= 0]
                kept = rng.choice(before, int(rng.random() * before.size), replace=False)
                n = min(k, sealed[t, s])
                fresh = rng.choice(np.setdiff1d(np.arange(sealed[t, s]), kept), n - kept.size, replace=False)
                ids[t, layer, s, :n] = np.sort(np.concatenate([kept, fresh]))
    return RecordedTrace(ids=ids, sealed=sealed.astype(np.int32), page_size=page_size, source=SOURCE)


def _dsa_trace(steps: int = 8, k: int = 16, page_size: int = 1) -> RecordedTrace:
    """2 layers, 2 streams: stream 0 holds 40 records at the first step (its context: 40 tokens),
    stream 1 only 12 (< k: its first rows are padded); each grows by one per step."""
    sealed = np.stack([40 + np.arange(steps), 12 + np.arange(steps)], axis=1)
    return _trace(sealed, layers=2, k=k, page_size=page_size)


def _write(tmp_path, trace: RecordedTrace, name: str = "trace.npz") -> str:
    path = tmp_path / name
    save_trace(path, trace)
    return str(path)


def _replayed_miss_rate(family, config, trace: RecordedTrace, batch: int) -> float:
    """The miss rate of the timed calls when the trace's ids, mapped onto the model by hand, go
    through RESOLVE from an empty hot buffer: the untimed call's STEPS steps warm it, the REPS
    timed calls' steps are counted (records fetched / records selected)."""
    layers, streams, records = family.selecting_layout(config, batch)
    cache_config = hs.CacheConfig(num_layers=layers, stream_shape=streams, pool_records=records,
                                  hot_slots=config.hot_slots, top_k=config.top_k, record_width=2,
                                  dtype=jnp.float32)
    pool, cache = hs.alloc_host_pool(cache_config), hs.init_hot_cache(cache_config)
    sealed = jnp.full(streams, records, jnp.int32)  # every id of the trace is valid
    fetched = 0
    for t in range(STEPS * (REPS + 1)):
        for g in range(layers):
            rows = np.stack([trace.ids[t, g * trace.layers // layers, i % trace.streams] for i in range(batch)])
            rows = rows.reshape(batch, *([1] * (len(streams) - 1)), config.top_k)  # the KV heads share them
            selection = np.broadcast_to(rows, (*streams, config.top_k))
            result, cache = hs.resolve(cache, pool, jnp.asarray(selection), sealed, g)
            fetched += int(result.misses.sum()) if t >= STEPS else 0
    return fetched / (STEPS * REPS * layers * int(np.prod(streams)) * config.top_k)


def _run(tmp_path, capsys, argv: list[str]) -> tuple[dict, str]:
    out = tmp_path / "decode"
    assert cli.main(["decode", *argv, "--out", str(out), *FAST]) == 0
    return json.loads((out / "decode.json").read_text()), capsys.readouterr().out


def test_a_recorded_trace_drives_the_decode_and_its_misses_are_resolves(tmp_path, capsys):
    trace = _dsa_trace()
    path = _write(tmp_path, trace)
    # Context 40 is the trace's own: stream 0 selects among all its sealed records at every step.
    data, stdout = _run(tmp_path, capsys, ["--contexts", "40", "--selection", "recorded", "--trace-file", path])
    name = f"recorded {Path(path).stem}"  # a short label in tables and plots; the path once, in the note
    assert data["selection"] == "recorded" and data["traces"] == [name]
    assert data["recorded_trace"] == dict(path=path, source=SOURCE, steps=8, layers=2, streams=2, k=16, page_size=1)
    (note,) = [n for n in data["notes"] if name in n]
    assert f"recorded trace {path}" in note and path not in stdout.split(note)[1]
    # the note names the source's headline fields; the JSON above holds all of it
    assert '(source {"model": "hand-made"})' in note and "trace selection" not in " ".join(data["notes"])
    assert note in stdout and f"| 40 | {name} | capacity | hisparse |" in stdout
    assert {r["trace"] for r in data["rows"]} == {name} and [q["trace"] for q in data["ratios"]] == [name]
    dsa = get_family("dsa")
    config = dsa.Config.tiny(max_context=tokens_needed(40, STEPS, REPS) + 1)
    hisparse = [r for r in data["rows"] if r["mode"] == "hisparse"]
    assert {r["run"] for r in hisparse} == {"capacity", "equal batch"}
    for r in hisparse:
        assert r["miss_rate"] > 0.05  # the trace keeps a random share: the cache misses often
        assert r["miss_rate"] == pytest.approx(_replayed_miss_rate(dsa, config, trace, r["batch"]), rel=1e-12)
    assert data["ratios"][0]["tokens_equal_at_equal_batch"] is True


def test_quest_kv_heads_share_their_streams_recorded_ids(tmp_path, capsys):
    """Quest selects per KV head ([b, kv_heads] streams): every head of stream i replays trace
    stream i mod S, and the misses are RESOLVE's for those broadcast ids."""
    quest = get_family("quest")
    tiny = quest.Config.tiny()
    sealed = np.stack([np.full(8, 8), np.full(8, 6)], axis=1)  # pages of 16 tokens: 128 and 96 tokens
    trace = _trace(sealed, layers=3, k=tiny.top_k, page_size=tiny.page_size)
    path = _write(tmp_path, trace)
    data, _ = _run(tmp_path, capsys, ["--family", "quest", "--contexts", "128", "--modes", "hisparse",
                                      "--selection", "recorded", "--trace-file", path])
    (row,) = data["rows"]
    config = quest.Config.tiny(max_context=-(-(tokens_needed(128, STEPS, REPS) + 1) // 16) * 16)
    assert row["miss_rate"] > 0
    assert row["miss_rate"] == pytest.approx(_replayed_miss_rate(quest, config, trace, row["batch"]), rel=1e-12)


def test_the_mapping_onto_layers_streams_and_kv_heads():
    trace = _trace(np.stack([np.full(5, 30), np.full(5, 20)], axis=1), layers=3, k=4)
    selection = RecordedSelection("t.npz", trace)
    for family_name, config in (("dsa", get_family("dsa").Config.tiny(top_k=4)),
                                ("quest", get_family("quest").Config.tiny())):
        family = get_family(family_name)
        ids = trace_ids(family, config, selection, jnp.full((3,), 64, jnp.int32), 5)
        layers, streams, _ = family.selecting_layout(config, 3)
        assert ids.shape == (5, layers, *streams, 4) and ids.dtype == np.int32
        for g in range(layers):
            for i in range(3):
                expected = trace.ids[:5, g * 3 // layers, i % 2]
                per_head = ids[:, g, i].reshape(5, -1, 4)  # DSA: one stream; Quest: one per KV head
                assert (per_head == expected[:, None]).all(), (family_name, g, i)
    with pytest.raises(ValueError, match="holds 5 steps"):
        trace_ids(get_family("dsa"), get_family("dsa").Config.tiny(top_k=4), selection,
                  jnp.full((3,), 64, jnp.int32), 6)


def test_recorded_ids_are_in_the_byte_account_as_the_synthetic_trace_ids(tmp_path):
    path = _write(tmp_path, _dsa_trace())
    base = ["decode", "--contexts", "40", *FAST]
    recorded = plan.build_plan(cli.parser().parse_args([*base, "--selection", "recorded", "--trace-file", path]))
    synthetic = plan.build_plan(cli.parser().parse_args([*base, "--selection", "trace"]))
    dsa, config = get_family("dsa"), recorded.contexts[0].config
    for mode in ("device", "hisparse"):
        ids = recorded.contexts[0].caps[mode].trace_ids_per_request
        assert ids == synthetic.contexts[0].caps[mode].trace_ids_per_request == trace_ids_bytes(dsa, config, 1, STEPS)
        assert ids > 0
    assert {r.trace for r in recorded.contexts[0].runs} == set(recorded.traces)
    assert isinstance(recorded.traces[0], RecordedSelection)


def _refuse_compiling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("compiled before refusing")

    monkeypatch.setattr(plan, "working_memory", refuse)
    monkeypatch.setattr(plan, "program_memory", refuse)


@pytest.mark.parametrize(
    "argv, needles",
    [
        (["--selection", "recorded"], ["--selection recorded", "add --trace-file PATH"]),
        (["--trace-file", "{trace}"], ["--trace-file", "add --selection recorded"]),
        (["--selection", "trace", "--trace-file", "{trace}"], ["--trace-file", "add --selection recorded"]),
        (["--selection", "recorded", "--trace-file", "{trace}", "--trace", "glm-5.1"],
         ["--trace:", "does not apply to --selection recorded", "drop it"]),
        (["--selection", "recorded", "--trace-file", "{trace}", "--trace-beta", "0.5", "--trace-memoryless-layers",
          "1"], ["--trace-beta, --trace-memoryless-layers:", "drop them"]),
        (["--selection", "recorded", "--trace-file", "{dir}/missing.npz"], ["--trace-file", "no such file"]),
        (["--selection", "recorded", "--trace-file", "{dir}/junk.npz"], ["--trace-file", "not a .npz archive"]),
        (["--selection", "recorded", "--trace-file", "{dir}/cut.npz"], ["--trace-file", "not a .npz archive"]),
        (["--selection", "recorded", "--trace-file", "{dir}"], ["--trace-file", "is a directory, not a file"]),
        (["--selection", "recorded", "--trace-file", "{k8}"], ["k=8", "the model's top_k is 16", "pass --top-k 8"]),
        (["--selection", "recorded", "--trace-file", "{k64}"], ["k=64", "pass --top-k 64 --hot-slots 64"]),
        (["--selection", "recorded", "--trace-file", "{paged}"],
         ["pages of 16 tokens", "the model's of 1", "--set page_size=16"]),
        (["--selection", "recorded", "--trace-file", "{trace}", "--reps", "4"],
         ["holds 8 decode steps", "a run decodes 10", "lower --steps or --reps"]),
        (["--selection", "recorded", "--trace-file", "{trace}", "--no-io"], ["a run decodes 16", "--no-io"]),
        (["--selection", "recorded", "--trace-file", "{trace}", "--contexts", "64", "39"],
         ["at context 39", "39 sealed records at step 0", "selects among 40", "--contexts of at least 40 tokens"]),
    ],
)
def test_a_recorded_trace_that_does_not_fit_is_one_line_and_exit_2_before_compiling(
        capsys, tmp_path, monkeypatch, argv, needles):
    files = dict(trace=_write(tmp_path, _dsa_trace()), k8=_write(tmp_path, _dsa_trace(k=8), "k8.npz"),
                 k64=_write(tmp_path, _dsa_trace(k=64), "k64.npz"),
                 paged=_write(tmp_path, _dsa_trace(page_size=16), "paged.npz"), dir=str(tmp_path))
    (tmp_path / "junk.npz").write_bytes(b"not an npz")
    (tmp_path / "cut.npz").write_bytes(Path(files["trace"]).read_bytes()[:200])
    _refuse_compiling(monkeypatch)
    # The case's own arguments come last: they override the defaults before them.
    argv = ["decode", "--contexts", "40", *FAST, "--out", str(tmp_path / "out"), *(a.format(**files) for a in argv)]
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("hisparse-bench: error: ") and err.count("\n") == 1, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", sorted(bad_npz.KINDS))
def test_every_kind_of_bad_trace_file_is_one_line_and_exit_2_before_compiling(capsys, tmp_path, monkeypatch,
                                                                              kind, one_line_error):
    path = bad_npz.make(kind, Path(_write(tmp_path, _dsa_trace())), tmp_path, "counts")
    _refuse_compiling(monkeypatch)
    err = one_line_error(["decode", "--contexts", "40", *FAST, "--out", str(tmp_path / "out"),
                          "--selection", "recorded", "--trace-file", str(path)])
    assert "--trace-file" in err and bad_npz.KINDS[kind] in err, err
    assert not (tmp_path / "out").exists()
