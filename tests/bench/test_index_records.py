"""The fine-key misses of `hisparse-bench indexers` (bench.indexers.index_misses): a trace's
index (the ids a kit indexer's own record kind fetched) replayed through LRU, against a
NumPy/Python oracle of RESOLVE's rules on a hand-made trace, and the whole command on the tiny
model with the two-level indexer, its trace file carrying the index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hisparse_jax.bench import cli, indexers_report
from hisparse_jax.bench.indexers import index_misses
from hisparse_jax.selection.recorded import RecordedTrace, load_trace

MY_INDEXERS = f"{Path(__file__).resolve().parents[1] / 'kit' / 'my_indexers.py'}:TWO_LEVEL_TINY"


def _lru_misses(rows: np.ndarray, capacity: int) -> np.ndarray:
    """[steps] misses of one row's selections [steps, k] (-1 padding) through RESOLVE's LRU
    (docs/contract.md rules 3-4), one Python list of slots least recently used first: empty slots
    first; miss j takes the j-th slot of the order not holding an id of the step; then the order
    is the untouched slots, the filled slots (miss order), the hit slots (old order)."""
    order = [None] * capacity  # the records the slots hold, least recently used first
    out = []
    for row in rows:
        wanted = [int(i) for i in row if i >= 0]
        hits = [r for r in order if r in wanted]
        missed = [i for i in wanted if i not in order]
        free = [j for j, r in enumerate(order) if r not in hits]
        taken = free[: len(missed)]
        order = [r for j, r in enumerate(order) if r not in hits and j not in taken] + missed + hits
        out.append(len(missed))
    return np.asarray(out)


def _hand_made(steps=40, groups=2, streams=3, fetch=4, seed=0) -> RecordedTrace:
    """A trace of pages drawn near a moving window, ascending, some rows short (-1 padding)."""
    rng = np.random.default_rng(seed)
    sealed = (fetch + 2 + np.arange(steps))[:, None].repeat(streams, 1).astype(np.int32)
    ids = np.full((steps, groups, streams, fetch), -1, np.int32)
    for t in range(steps):
        for g in range(groups):
            for s in range(streams):
                n = fetch - int(rng.integers(0, 2))
                pages = rng.choice(np.arange(max(0, sealed[t, s] - 3 * fetch), sealed[t, s]), n, replace=False)
                ids[t, g, s, :n] = np.sort(pages)
    source = dict(kind="index-records", page=64, width=64, dtype="bfloat16", fetch=fetch, hot_slots=6,
                  record_bytes=8192)
    return RecordedTrace(ids=ids, sealed=sealed, page_size=64, source=source)


@pytest.mark.parametrize("seed", [0, 1])
def test_index_misses_match_the_lru_oracle(seed):
    trace, warm = _hand_made(seed=seed), 5
    got = index_misses(trace, [1.0, 2.0], warm)
    assert got["ratios"] == [1.0, 2.0, 1.5] and got["capacities"] == [4, 8, 6]  # the hot slots added
    rows = trace.ids.transpose(1, 2, 0, 3).reshape(-1, trace.steps, trace.k)  # (group, stream) rows
    selected = int((trace.ids[warm:] >= 0).sum())
    tokens = (trace.steps - warm) * trace.streams
    assert got["selected"] == selected
    for capacity, misses, rate, per_token in zip(got["capacities"], got["misses"], got["miss_rate"],
                                                 got["miss_bytes_per_token"]):
        want = sum(int(_lru_misses(r, capacity)[warm:].sum()) for r in rows)
        assert misses == want and rate == want / selected and per_token == want * 8192 / tokens
    assert got["misses"][0] > got["misses"][2] > got["misses"][1] > 0  # more slots, fewer misses


def test_the_hot_slots_are_not_replayed_twice():
    assert index_misses(_hand_made(), [1.5, 3.0], 0)["ratios"] == [1.5, 3.0]


@pytest.mark.parametrize("changes, error", [
    (dict(hot_slots=None), "the trace's index names hot_slots=None"),
    (dict(record_bytes=True), "names record_bytes=True"),
    (dict(hot_slots=3), "hot_slots=3 below its fetch=4"),
])
def test_an_index_without_its_shape_is_one_line(changes, error):
    trace = _hand_made()
    bad = RecordedTrace(ids=trace.ids, sealed=trace.sealed, page_size=64, source={**trace.source, **changes})
    with pytest.raises(ValueError, match=error):
        index_misses(bad, [1.0], 0)


def test_the_comparison_reports_the_two_level_fine_key_misses(text_root, tmp_path, capsys):
    """Trained 2 steps a phase on the tiny model, recorded after 256 tokens (16 pages of 16
    tokens, 8 candidates): the fine-key pages fetched are in the trace, replayed in the table."""
    assert cli.main(["indexers", "--model", "tiny", "--indexer", MY_INDEXERS, "--max-steps", "2", "--roots",
                     str(text_root), "--documents", "1", "--prefill", "256", "--steps", "24", "--contexts", "32768",
                     "--policies", "lru", "--no-plots", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (entry,) = json.loads((tmp_path / "indexers.json").read_text())["indexers"]
    index = entry["misses"]["index_records"]
    trace = load_trace(entry["misses"]["trace"]["file"])
    assert trace.index is not None and trace.index.ids.shape == (24, 2, 1, 8)  # steps, groups, streams, fetch
    assert (trace.index.sealed[:, 0] == (256 + np.arange(24)) // 16).all()
    assert (np.sort(trace.index.ids, axis=-1)[..., -1] >= 0).all()  # 16 sealed pages: every candidate fetched
    assert index["kind"]["record_bytes"] == 16 * 16 * 4  # page x fine_dim float32 (the CPU model's dtype)
    assert index["hot_slots"] == 12 and index["capacities"] == [8, 16, 24, 32, 12]
    assert index == index_misses(trace.index, [1.0, 2.0, 3.0, 4.0], entry["misses"]["warm"]) | dict(
        kind=index["kind"])  # what the JSON holds is the replay of the file
    assert all(0 <= r <= 1 for r in index["miss_rate"]) and index["misses"][0] >= index["misses"][1]
    kv = entry["misses"]["miss_bytes_per_token"]["lru"]
    assert len(kv) == 4 and kv[0] > 0
    for line in ("| two-level-16x8 | index records (16 tokens x 16 float32), miss rate |",
                 "| | index records, miss bytes / token |", "| | KV records, miss bytes / token |"):
        assert line in out, out
    assert indexers_report.index_records_table(dict(ratios=[1.0], indexers=[dict(entry, misses={
        **entry["misses"], "index_records": None})])) == []  # no record kind: no table
