"""The decode report's plots: throughput and TPOT against context, one line per run and trace."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from .report import MODE_NAMES, fmt_bytes


def plot_title(report: dict) -> str:
    """What a plot shows: model, device, selection, fill and budget."""
    model = (f"{report['deployment']} slice" if report.get("deployment")
             else f"{report['family']} {report['preset']}")
    traces = f" ({', '.join(report['traces'])})" if report.get("traces") else ""
    return (f"{model}, {report['num_layers']} layers, on {report['device']}\n"
            f"selection: {report['selection']}{traces}; fill: {report['fill']}; "
            f"device budget {fmt_bytes(report['device_budget_bytes'])}")


def write_plots(report: dict, out: Path) -> list[Path]:
    """throughput.png and tpot.png vs context: each mode at its capacity batch and HiSparse at the
    baseline's batch (equal batch), one line per trace calibration; median with min-max bars."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: plots skipped (pip install matplotlib)", file=sys.stderr)
        return []
    paths = []
    series = [(run, mode, trace) for run, mode in (("capacity", "device"), ("capacity", "hisparse"),
                                                   ("prefetch", "hisparse"), ("equal batch", "hisparse"))
              for trace in (report.get("traces") or [None])]
    for key, spread, label, name in (
        ("tokens_per_s", lambda r: r["tokens_per_s_range"], "decode tokens/s", "throughput.png"),
        ("tpot_ms_median", lambda r: [r["tpot_ms_min"], r["tpot_ms_max"]], "TPOT (ms per step)", "tpot.png"),
    ):
        fig, ax = plt.subplots(figsize=(8.5, 4.2))
        for run, mode, trace in series:
            rows = [r for r in report["rows"] if r["mode"] == mode and r["run"] == run and r.get("trace") == trace]
            if rows:
                mid = np.array([r[key] for r in rows])
                low, high = np.array([spread(r) for r in rows]).T
                where = {"capacity": "at capacity", "prefetch": "with prefetch at capacity"}.get(
                    run, "at the baseline's batch")
                ax.errorbar([r["context"] for r in rows], mid, yerr=[mid - low, high - mid], marker="o",
                            linestyle={"capacity": "-", "prefetch": ":"}.get(run, "--"), capsize=3,
                            label=f"{MODE_NAMES[mode]} {where}" + (f", {trace}" if trace else ""))
        ax.set_xscale("log", base=2)
        contexts = sorted({r["context"] for r in report["rows"]})
        ax.set_xticks(contexts, labels=[str(c) for c in contexts])
        ax.minorticks_off()
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel(label)
        ax.set_title(plot_title(report), fontsize=8)
        # Beside the axes, not on them: with several traces the legend would cover the data.
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120, bbox_inches="tight")
        plt.close(fig)
        paths.append(out / name)
    return paths
