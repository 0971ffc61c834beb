"""DSA's training figures before the training forward took a protocol indexer, and the code that
computes them: the losses and KLs of one forward, and the history of a short tiny plan
(tests/train/test_dsa_training_golden.py compares them exactly).

tests/data/dsa_training_golden.json holds one set a host (tests/golden_hosts.py says why and how a
host finds its set), each with both XLA settings the suite runs with: "optimizations_off" (what
tests/models/conftest.py and tests/kit/conftest.py set for the whole process when they are
collected) and "optimizations_on" (a file run alone). The first set was recorded on 2026-12-04
from main's hisparse_jax.train at commit 186b06d (the forward computed the lightning indexer's keys
itself), before sets named their host; tests/record_goldens.sh records this host's from the
pre-kit commit (the same training code), one process per setting:
    python tests/train/dsa_training_golden.py off|on tests/data/dsa_training_golden.json
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

SETTINGS = {"off": "optimizations_off", "on": "optimizations_on"}


def setting() -> str:
    """The key of the XLA setting this process compiles under."""
    return SETTINGS["off" if jax.config.read("jax_disable_most_optimizations") else "on"]


def forward_figures(attention: str) -> list:
    """[loss, lm, [KL per layer]] of forward_loss(tiny, dsa.init_weights(config, 3), random tokens
    [2, 65] of seed 0, chunk 32) with "dense" or "sparse" attention."""
    from hisparse_jax.models import dsa
    from hisparse_jax.train import fit as fit_lib
    from hisparse_jax.train.forward import forward_loss

    config = fit_lib.model_config("tiny")
    weights = dsa.init_weights(config, 3)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (2, 65)), jnp.int32)
    loss, parts = forward_loss(config, weights, tokens, sparse=attention == "sparse", chunk=32)
    return [float(loss), float(parts["lm"]), np.asarray(parts["kl"]).tolist()]


def synthetic_corpus(folder: Path):
    """12 documents of seeded words (the same bytes on every machine, unlike the standard library)."""
    from hisparse_jax.train.corpus import Corpus

    rng = np.random.default_rng(7)
    words = [w.encode() for w in ("the of and to in is that for it as with was on be by at this are from or an "
                                  "which have not").split()]
    for i in range(12):
        (folder / f"doc{i:02d}.txt").write_bytes(b" ".join(words[j] for j in rng.integers(0, len(words), 700)))
    return Corpus.from_roots([folder], held_out_fraction=0.25)


def fit_figures(folder: Path) -> dict:
    """The tiny plan fitted 4 steps a phase on the synthetic corpus: "history" = [lm, mean KL] per
    step, "held_out" = [dense lm, sparse lm] after each phase."""
    from hisparse_jax.train import fit as fit_lib

    root = folder / "text"
    root.mkdir()
    plan = fit_lib.PLANS["tiny"]
    plan = dataclasses.replace(plan, log_every=1, phases=tuple(dataclasses.replace(p, steps=4) for p in plan.phases))
    _, history, summary = fit_lib.fit(fit_lib.model_config("tiny"), plan, synthetic_corpus(root), log=lambda m: None)
    return {"history": [[h["lm"], h["kl"]] for h in history],
            "held_out": [[p["evaluation"]["dense"]["lm"], p["evaluation"]["sparse"]["lm"]] for p in summary["phases"]]}


def load_sets(path: Path) -> list[dict]:
    return json.loads(Path(path).read_text())["sets"]


def recorded_figures(recorded: dict) -> dict:
    """The figures of a chosen set under this process's XLA setting; skips when it has none."""
    figures = recorded.get(setting())
    if figures is None:
        import pytest
        pytest.skip(f"the DSA training set {recorded['fingerprint']} has no figures under {setting()}: "
                    "record them with `tests/record_goldens.sh`")
    return figures


def dumps(value, indent: int = 0) -> str:
    """JSON with one line a figure list (json's float repr round-trips every float32 exactly)."""
    pad = " " * indent
    if isinstance(value, dict) and any(isinstance(v, (dict, list)) for v in value.values()) or \
            isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        inner = [(f"{json.dumps(key)}: " if isinstance(value, dict) else "") + dumps(item, indent + 1)
                 for key, item in items]
        open_, close = "{}" if isinstance(value, dict) else "[]"
        return open_ + "\n" + ",\n".join(f"{pad} {line}" for line in inner) + "\n" + pad + close
    return json.dumps(value)


def main(which: str, path: str) -> None:
    """Adds (or replaces) this host's figures under one XLA setting in PATH."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # golden_hosts, whichever package is installed
    import golden_hosts

    jax.config.update("jax_disable_most_optimizations", which == "off")
    with tempfile.TemporaryDirectory() as folder:
        figures = {"forward": {a: forward_figures(a) for a in ("dense", "sparse")}, **fit_figures(Path(folder))}
    sets = load_sets(path)
    here = [s for s in sets if s["fingerprint"] == golden_hosts.fingerprint() and s["jax_version"] == jax.__version__]
    if not here:
        here = [{"fingerprint": golden_hosts.fingerprint(), "host": golden_hosts.describe_host(),
                 "jax_version": jax.__version__, "recorded_from": golden_hosts.PRE_KIT_COMMIT}]
        sets.append(here[0])
    here[0][SETTINGS[which]] = figures
    Path(path).write_text(dumps({"sets": sets}) + "\n")
    print(f"wrote {SETTINGS[which]} of set {golden_hosts.fingerprint()} in {path}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in SETTINGS:
        sys.exit("usage: python tests/train/dsa_training_golden.py off|on FILE.json")
    main(sys.argv[1], sys.argv[2])
