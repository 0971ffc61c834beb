"""Rows, ratios and the table of a `hisparse-bench decode` report.

Every timed run keeps one sample per timed call (seconds per step); a row reports their
min / median / max. The runs of a context are timed in rounds (one call of each per round,
back to back), so a ratio between two runs is taken per round, where both calls met the same
machine load: a ratio is the median of its per-round values, and its range their min and max
(runs timed one after the other pair their i-th calls the same way).
The names of ratios say their direction ("throughput hisparse/full-KV": above 1 means HiSparse
decodes more tokens per second).
"""

from __future__ import annotations

import json

import numpy as np

from ..errors import BenchError
from ..user_files import read_bounded_text
from .capacity import Capacity
from .runner import DecodeTiming

MiB, GiB = 2**20, 2**30


# A decode.json is a few MB even with profiles of every kind of kernel; a file far past that is
# not one, and is refused before it is read.
REPORT_MAX_BYTES = 256 << 20


def load_report(path: str, keys: tuple[str, ...] = ("rows", "ratios")) -> dict:
    """A `hisparse-bench decode` report (decode.json) read for a script, or BenchError in one line:
    not a readable regular file, larger than REPORT_MAX_BYTES, not JSON, or not an object holding
    `keys`."""
    wanted = "a decode.json written by hisparse-bench decode" + (" --profile" if "profiles" in keys else "")
    text = read_bounded_text(path, REPORT_MAX_BYTES, wanted)
    try:
        report = json.loads(text)
    # ValueError: JSONDecodeError, and an integer of more digits than Python converts; RecursionError:
    # "[[[[..." nested past the parser's stack.
    except (ValueError, RecursionError) as err:
        raise BenchError(f"{path}: not JSON ({type(err).__name__}: {str(err)[:80]}); pass {wanted}") from None
    if not isinstance(report, dict) or not set(keys) <= report.keys():
        raise BenchError(f"{path}: not a hisparse-bench decode report (no {' and '.join(keys)}); pass {wanted}")
    return report


def range_note(in_turns: bool) -> str:
    """How the ratios and their ranges were taken."""
    if in_turns:
        return ("ratios: median [min, max] over the rounds of timed calls of the ratio of the two runs' calls "
                "in that round")
    return ("ratios: median [min, max] over i of the ratio of the two runs' i-th timed calls (the runs were timed "
            "one after the other: a pair did not meet the same machine load)")


# JSON key -> table heading, in table order. Keys of timed ratios have a "<key>_range" twin.
RATIO_COLUMNS = {
    "throughput_hisparse_over_full_kv": "throughput hisparse/full-KV",
    "roofline_throughput_hisparse_over_full_kv": "throughput at both rooflines",
    "batch_hisparse_over_full_kv": "batch hisparse/full-KV",
    "tpot_hisparse_over_full_kv_at_equal_batch": "TPOT hisparse/full-KV at equal batch",
    "kv_hbm_per_request_full_kv_over_hisparse": "KV HBM per request full-KV/hisparse",
    "device_bytes_per_request_full_kv_over_hisparse": "device bytes per request full-KV/hisparse",
    "tokens_equal_at_equal_batch": "tokens equal at equal batch",
    "tpot_prefetch_over_hisparse": "TPOT prefetch/hisparse",
    "throughput_prefetch_over_full_kv": "throughput prefetch/full-KV",
    "tokens_equal_with_prefetch": "tokens equal with prefetch",
}
MODE_NAMES = {"device": "full-KV", "hisparse": "hisparse"}


def index_io_bytes(timing: DecodeTiming, config) -> float:
    """Bytes per step of a kit indexer's own records fetched from the host pool (0 without them)."""
    get = getattr(config, "index_cache_config", None)
    index = None if get is None else get(1)
    return 0.0 if index is None else timing.index_misses_per_step * index.record_bytes


def row(run: str, timing: DecodeTiming, cap: Capacity, record_bytes: int, config, limited_by: str) -> dict:
    """One table row (a decode.json "rows" entry) of a timed run."""
    miss_rate = timing.misses_per_step / timing.selected_per_step if timing.selected_per_step else 0.0
    return dict(
        run=run,
        mode=timing.mode,
        context=timing.context,
        max_context=config.max_context,
        batch=timing.batch,
        tokens_per_s=timing.tokens_per_second,
        tokens_per_s_range=[timing.batch / timing.step_seconds_max, timing.batch / timing.step_seconds_min],
        tpot_ms_min=timing.step_seconds_min * 1e3,
        tpot_ms_median=timing.step_seconds * 1e3,
        tpot_ms_max=timing.step_seconds_max * 1e3,
        step_ms_all=[t * 1e3 for t in timing.step_seconds_all],
        miss_rate=miss_rate,
        # Both record kinds' miss IO: the KV's and a kit indexer's own (kit.RecordKind; 0 for others).
        io_bytes_per_token=(timing.misses_per_step * record_bytes + index_io_bytes(timing, config)) / timing.batch
        if timing.fetch else 0.0,
        index_io_bytes_per_token=index_io_bytes(timing, config) / timing.batch if timing.fetch else 0.0,
        device_bytes_per_request=cap.device_per_request,
        kv_device_bytes_per_request=cap.device_per_request_by_category.get("kv records", 0),
        device_bytes_by_category=cap.device_per_request_by_category,
        working_bytes_fixed=cap.working_fixed,
        working_bytes_per_request=cap.working_per_request + cap.trace_ids_per_request,
        working_bytes_at_capacity=cap.working_at_max_batch,
        host_bytes_per_request=cap.host_per_request,
        max_batch=cap.max_batch,
        limited_by=limited_by,
        top_k=config.top_k,
        hot_slots=config.hot_slots,
    )


def _per_round(values: np.ndarray) -> tuple[float, list[float]]:
    return float(np.median(values)), [float(values.min()), float(values.max())]


def _time_ratios(num: DecodeTiming, den: DecodeTiming) -> np.ndarray:
    """num's step time / den's, per round (the i-th timed calls of both)."""
    if len(num.step_seconds_all) != len(den.step_seconds_all):
        raise ValueError("ratios need the same number of timed calls in both runs")
    return np.asarray(num.step_seconds_all) / np.asarray(den.step_seconds_all)


def ratios(context: int, hisparse: DecodeTiming, device: DecodeTiming, equal: DecodeTiming | None,
           caps: dict[str, Capacity], prefetch: DecodeTiming | None = None) -> dict:
    """The HiSparse / full-KV comparison at one context (a decode.json "ratios" entry); the
    equal-batch keys only when the equal-batch run ran, the prefetch keys only when the prefetch
    run did (it decodes the same batch from the same state as the capacity run: its tokens must
    be the same)."""
    batch = hisparse.batch / device.batch
    # throughput = batch / step time, so its ratio is the batch ratio x the inverse time ratio.
    throughput, throughput_range = _per_round(batch * _time_ratios(device, hisparse))
    kv_h = caps["hisparse"].device_per_request_by_category.get("kv records", 0)
    kv_d = caps["device"].device_per_request_by_category.get("kv records", 0)
    out = dict(
        context=context,
        throughput_hisparse_over_full_kv=throughput,
        throughput_hisparse_over_full_kv_range=throughput_range,
        batch_hisparse_over_full_kv=batch,
        kv_hbm_per_request_full_kv_over_hisparse=kv_d / kv_h if kv_h else float("inf"),
        device_bytes_per_request_full_kv_over_hisparse=(
            caps["device"].device_per_request / caps["hisparse"].device_per_request),
    )
    if equal is not None:
        tpot, tpot_range = _per_round(_time_ratios(equal, device))
        out.update(
            tpot_hisparse_over_full_kv_at_equal_batch=tpot,
            tpot_hisparse_over_full_kv_at_equal_batch_range=tpot_range,
            tokens_equal_at_equal_batch=bool(np.array_equal(equal.tokens, device.tokens)),
        )
    if prefetch is not None:
        tpot, tpot_range = _per_round(_time_ratios(prefetch, hisparse))
        gain, gain_range = _per_round((prefetch.batch / device.batch) * _time_ratios(device, prefetch))
        out.update(
            tpot_prefetch_over_hisparse=tpot,
            tpot_prefetch_over_hisparse_range=tpot_range,
            throughput_prefetch_over_full_kv=gain,
            throughput_prefetch_over_full_kv_range=gain_range,
            tokens_equal_with_prefetch=bool(np.array_equal(prefetch.tokens, hisparse.tokens)),
        )
    return out


def roofline_ratio(profiles: list[dict], context: int, trace: str | None) -> float | None:
    """HiSparse / full-KV throughput with both modes at their rooflines (batch / roofline step of
    each mode's profiled capacity run at `context` under `trace`), on the machine measured: the
    ratio the measured one tends to as both modes approach their rooflines. A measured ratio above
    it means full-KV is further below its roofline than HiSparse. None unless both runs were
    profiled with a roofline."""
    found = {p["mode"]: p for p in profiles
             if p.get("run", "capacity") == "capacity" and p["context"] == context and p.get("trace") == trace}
    if not {"device", "hisparse"} <= found.keys():
        return None
    device, hisparse = found["device"], found["hisparse"]
    if not (device.get("roofline_seconds", 0) > 0 and hisparse.get("roofline_seconds", 0) > 0):
        return None
    return (hisparse["batch"] / hisparse["roofline_seconds"]) / (device["batch"] / device["roofline_seconds"])


def fmt_bytes(n: float) -> str:
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt_ratio(q: dict, key: str) -> str:
    if key not in q:
        return "-"
    value = q[key]
    if isinstance(value, bool):
        return str(value)
    digits = 1 if key.startswith("kv_hbm") else 2
    text = f"{value:.{digits}f}"
    if key + "_range" in q:
        low, high = q[key + "_range"]
        text += f" [{low:.2f}, {high:.2f}]"
    return text


def format_table(report: dict) -> str:
    """The rows table, then (when both modes ran) the ratios table, in Markdown."""
    head = ("| context | trace | run | mode | batch (limit) | tokens/s (median) | TPOT ms min / median / max | "
            "miss rate | IO/token | device/request (kv part) | host/request |")
    lines = [head, "|" + "---|" * 11]
    for r in report["rows"]:
        lines.append(
            f"| {r['context']} | {r.get('trace') or '-'} | {r['run']} | {MODE_NAMES.get(r['mode'], r['mode'])} | {r['batch']} "
            f"({r['limited_by']}) | {r['tokens_per_s']:.1f} | {r['tpot_ms_min']:.2f} / "
            f"{r['tpot_ms_median']:.2f} / {r['tpot_ms_max']:.2f} | {r['miss_rate']:.1%} | "
            f"{fmt_bytes(r['io_bytes_per_token'])} | {fmt_bytes(r['device_bytes_per_request'])} "
            f"({fmt_bytes(r['kv_device_bytes_per_request'])}) | {fmt_bytes(r['host_bytes_per_request'])} |"
        )
    if report["ratios"]:
        # A column no comparison filled (the prefetch ones without --prefetch) is left out.
        columns = {k: v for k, v in RATIO_COLUMNS.items() if any(k in q for q in report["ratios"])}
        lines += ["", "| context | trace | " + " | ".join(columns.values()) + " |",
                  "|" + "---|" * (len(columns) + 2)]
        for q in report["ratios"]:
            lines.append(f"| {q['context']} | {q.get('trace') or '-'} | "
                         + " | ".join(_fmt_ratio(q, k) for k in columns) + " |")
    return "\n".join(lines)
