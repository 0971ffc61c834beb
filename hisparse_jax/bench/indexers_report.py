"""The report of `hisparse-bench indexers`: its tables (Markdown, stdout) and its plot (PNG)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .decode.report import fmt_bytes


def _f(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def _percent(value) -> str:
    return "-" if value is None else f"{value:.1%}"


def _ratio_at(entry: dict, policy: str, ratio: float):
    misses = entry["misses"]
    if policy not in misses["miss_rate"] or float(ratio) not in misses["ratios"]:
        return None
    return misses["miss_rate"][policy][misses["ratios"].index(float(ratio))]


def quality_table(report: dict) -> list[str]:
    """Loss, KL and top-k mass per indexer."""
    lines = ["| indexer | k | held-out loss, dense | sparse | sparse - dense | KL (dense) | KL (sparse) | "
             "top-k attention mass | indexer parameters |", "|---|---|---|---|---|---|---|---|---|"]
    for e in report["indexers"]:
        h = e["held_out"]
        lines.append(f"| {e['label']} | {e['top_k']} | {_f(h['dense_lm'])} | {_f(h['sparse_lm'])} | "
                     f"{_f(h['sparse_minus_dense'], '+.4f')} | {_f(h['kl_dense'])} | {_f(h['kl_sparse'])} | "
                     f"{_percent(h['captured'])} | {e['parameters']:,} |")
    return lines


def misses_table(report: dict) -> list[str]:
    """Miss rate per indexer and policy at each B/k (all policies replayed)."""
    ratios = report["ratios"]
    lines = ["| indexer | policy | " + " | ".join(f"B/k = {r:g}" for r in ratios)
             + " | step overlap | adjacent-layer overlap |", "|---|---|" + "---|" * (len(ratios) + 2)]
    for e in report["indexers"]:
        overlaps = [_mean_known(e["misses"][key]) for key in ("step_overlap", "layer_overlap")]
        for i, policy in enumerate(report["policies"]):
            shown = " | ".join(overlaps) if i == 0 else " | "
            lines.append(f"| {e['label'] if i == 0 else ''} | {policy} | "
                         + " | ".join(_percent(_ratio_at(e, policy, r)) for r in ratios) + f" | {shown} |")
    t = report["indexers"][0]["misses"] if report["indexers"] else None
    if t is not None:
        lines += ["", f"misses / selected ids from step {t['warm']} of {t['steps']} on, {t['streams']} streams of "
                  f"held-out text after {t['trace']['prefill']} tokens (traces under --out/NAME/trace.npz)"]
    return lines


def index_records_table(report: dict) -> list[str]:
    """For indexers with a record kind of their own (kit.RecordKind): their records' LRU misses
    at each B/k and at the kind's hot slots, in rate and in bytes per decoded token, beside the
    KV records' LRU miss bytes per token at the same B/k."""
    entries = [e for e in report["indexers"] if (e["misses"].get("index_records") or None) is not None]
    if not entries:
        return []
    ratios = report["ratios"]
    lines = ["| indexer | records (LRU) | " + " | ".join(f"B/k = {r:g}" for r in ratios) + " | at hot slots |",
             "|---|---|" + "---|" * (len(ratios) + 1)]
    for e in entries:
        x, m = e["misses"]["index_records"], e["misses"]
        at = lambda values, r: values[x["ratios"].index(float(r))] if float(r) in x["ratios"] else None
        hot = lambda values: values[x["capacities"].index(x["hot_slots"])]
        kv = (m.get("miss_bytes_per_token") or {}).get("lru")
        kv_at = lambda r: kv[m["ratios"].index(float(r))] if kv and float(r) in m["ratios"] else None
        size = f"{x['kind'].get('page')} tokens x {x['kind'].get('width')} {x['kind'].get('dtype')}"
        lines += [f"| {e['label']} | index records ({size}), miss rate | "
                  + " | ".join(_percent(at(x["miss_rate"], r)) for r in ratios)
                  + f" | {_percent(hot(x['miss_rate']))} (B = {x['hot_slots']}, fetch {x['fetch']}) |",
                  "| | index records, miss bytes / token | "
                  + " | ".join(_bytes(at(x["miss_bytes_per_token"], r)) for r in ratios)
                  + f" | {_bytes(hot(x['miss_bytes_per_token']))} |",
                  "| | KV records, miss bytes / token | " + " | ".join(_bytes(kv_at(r)) for r in ratios) + " | |"]
    lines += ["", "the indexer's own records (kit.RecordKind) it fetched while recording the trace, replayed through "
              "LRU per group and stream; B/k here is hot slots over records fetched per step"]
    return lines


def _bytes(value) -> str:
    return "-" if value is None else fmt_bytes(value)


def _mean_known(values) -> str:
    known = [v for v in values if v is not None]
    return f"{np.mean(known):.3f}" if known else "-"


def bytes_table(report: dict) -> list[str]:
    """Device bytes per request: the HiSparse state (its indexer metadata apart) and full-KV's."""
    contexts = report["contexts"]
    lines = ["| indexer | state | " + " | ".join(f"{c // 1024}K" for c in contexts) + " |",
             "|---|---|" + "---|" * len(contexts)]
    for e in report["indexers"]:
        b = e["bytes_per_request"]
        rows = (("HiSparse, indexer metadata", lambda x: x["hisparse_by_category"].get("indexer metadata", 0)),
                ("HiSparse, all device state", lambda x: x["hisparse"]), ("full-KV, all device state",
                                                                          lambda x: x["full_kv"]))
        if any(b[str(c)].get("hisparse_indexer_records") for c in contexts):  # a kit.RecordKind's hot buffer
            rows = (rows[0], ("HiSparse, indexer records (hot buffer, open page)",
                              lambda x: x["hisparse_indexer_records"]), *rows[1:])
        for i, (name, pick) in enumerate(rows):
            lines.append(f"| {e['label'] if i == 0 else ''} | {name} | "
                         + " | ".join(fmt_bytes(pick(b[str(c)])) for c in contexts) + " |")
    return lines


def deployment_lines(report: dict) -> list[str]:
    """The deployment slice's capacity and throughput per indexer, or why it was skipped."""
    measured = [e for e in report["indexers"] if e.get("deployment")]
    if not measured:
        return [f"deployment slice: {report.get('deployment_note') or 'not measured'}"]
    lines = ["| indexer | slice | context | full-KV batch | HiSparse batch | throughput ratio (HiSparse / full-KV) |",
             "|---|---|---|---|---|---|"]
    for e in measured:
        if e["deployment"].get("error"):
            lines.append(f"| {e['label']} | {e['deployment']['slice']} | not measured: {e['deployment']['error']} |"
                         " | | |")
        for row in e["deployment"]["rows"]:
            lines.append(f"| {e['label']} | {e['deployment']['slice']} | {row['context']} | {row['full_kv_batch']} | "
                         f"{row['hisparse_batch']} | {_f(row.get('throughput_ratio'), '.2f')} |")
    return lines


def format_report(report: dict) -> str:
    """The tables: quality, misses per policy, the indexer's own records' misses (a record kind),
    bytes per request, the deployment slice."""
    return "\n".join([f"indexers compared on {report['device']}", "", *quality_table(report), "",
                      *misses_table(report), "", *([*index, ""] if (index := index_records_table(report)) else []),
                      *bytes_table(report), "", *deployment_lines(report)])


def write_plot(report: dict, out: Path) -> list[Path]:
    """indexers.png: LRU miss rate against B/k, device bytes per request against context, and
    the held-out loss gap and top-k mass, one colour per indexer."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: indexers.png skipped, indexers.json written "
              "(pip install 'hisparse-jax[plots]')", file=sys.stderr)
        return []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, e in enumerate(report["indexers"]):
        m, colour = e["misses"], f"C{i}"  # one colour per indexer in every panel
        for policy, style in (("lru", "-o"), ("belady", ":s")):
            if policy in m["miss_rate"]:
                rates = [np.nan if r is None else 100 * r for r in m["miss_rate"][policy]]
                axes[0].plot(m["ratios"], rates, style, color=colour, label=f"{e['label']} {policy}")
        contexts = report["contexts"]
        b = e["bytes_per_request"]
        axes[1].plot([c / 1024 for c in contexts], [b[str(c)]["hisparse"] / 2**20 for c in contexts], "-o",
                     color=colour, label=f"{e['label']} HiSparse")
        axes[1].plot([c / 1024 for c in contexts], [b[str(c)]["full_kv"] / 2**20 for c in contexts], ":",
                     color=colour, label=f"{e['label']} full-KV")
    axes[0].set(xlabel="B / k", ylabel="miss rate (% of selected ids)", title="recorded trace: misses")
    axes[1].set(xlabel="context (K tokens)", ylabel="device MiB per request", title="device bytes per request")
    labels = [e["label"] for e in report["indexers"]]
    gap = [e["held_out"]["sparse_minus_dense"] for e in report["indexers"]]
    mass = [100 * (e["held_out"]["captured"] or np.nan) for e in report["indexers"]]
    x = np.arange(len(labels))
    axes[2].bar(x - 0.2, mass, 0.4, color="0.6")
    twin = axes[2].twinx()
    twin.bar(x + 0.2, gap, 0.4, color="0.15")
    axes[2].set_xticks(x, labels)
    axes[2].set(ylabel="top-k attention mass (%, grey)", title="held-out: top-k mass, sparse - dense loss")
    twin.set_ylabel("sparse - dense held-out loss (nats/byte, black)")
    for ax in axes[:2]:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "indexers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
