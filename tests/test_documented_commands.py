"""Every command the README and docs/ show runs on a CPU: each parses with today's options, and
runs at a small size (the decode commands as --explain, which plans a GPU slice on a CPU without
compiling; policies on a small trace). `./dev bench` runs in CI as the README's main job, and the
train commands run in tests/train/test_train.py at their tiny size."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest

from hisparse_jax.bench import cli
from hisparse_jax.selection.recorded import RecordedTrace, save_trace
from hisparse_jax.train import __main__ as train_cli

ROOT = Path(__file__).resolve().parents[1]
_COMMAND = re.compile(r"(hisparse-bench (decode|policies|bitwise|indexers)|python3? -m hisparse_jax\.(train|bench)) ")


def documented_commands() -> list[tuple[str, str]]:
    """(file, command line) of every command in a shell block of README.md and docs/*.md."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        inside, lang, block = False, "", []
        for line in path.read_text().splitlines():
            if line.startswith("```"):
                if inside and lang in ("", "bash", "sh", "console"):
                    for command in "\n".join(block).replace("\\\n", " ").splitlines():
                        command = command.split(" #")[0].strip()
                        if _COMMAND.match(command + " "):
                            out.append((path.name, " ".join(command.split())))
                inside, lang, block = not inside, line[3:].strip(), []
            elif inside:
                block.append(line)
    return out


COMMANDS = documented_commands()


def _argv(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command)
    if words[0] == "hisparse-bench":
        return "bench", words[1:]
    return ("train" if words[2] == "hisparse_jax.train" else "bench"), words[3:]


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 10, COMMANDS


@pytest.mark.parametrize("where, command", COMMANDS, ids=[f"{w}:{c[:60]}" for w, c in COMMANDS])
def test_a_documented_command_parses(where, command):
    tool, argv = _argv(command)
    (cli.parser() if tool == "bench" else train_cli.parser()).parse_args(argv)


def _small_trace(path: Path) -> str:
    rng = np.random.default_rng(0)
    steps, layers, streams, k = 12, 2, 2, 8
    sealed = (64 + np.arange(steps))[:, None].repeat(streams, 1).astype(np.int32)
    ids = np.stack([np.stack([np.stack([np.sort(rng.choice(64, k, replace=False)) for _ in range(streams)])
                              for _ in range(layers)]) for _ in range(steps)]).astype(np.int32)
    save_trace(path, RecordedTrace(ids=ids, sealed=sealed))
    return str(path)


RUNNABLE = [(w, c) for w, c in COMMANDS if _argv(c)[0] == "bench" and _argv(c)[1][0] in ("decode", "policies")]


@pytest.mark.parametrize("where, command", RUNNABLE, ids=[f"{w}:{c[:60]}" for w, c in RUNNABLE])
def test_a_documented_command_runs_on_a_cpu_at_a_small_size(where, command, tmp_path, capsys):
    _, argv = _argv(command)
    if argv[0] == "decode":
        if "--selection" in argv and "recorded" in argv:
            pytest.skip("replays a recorded trace at a GPU slice's context (tests/bench/decode covers replay)")
        argv = [a for a in argv if a not in ("--profile", "--prefetch")] + ["--explain"]
    else:  # policies: on a small trace, a few steps
        trace = _small_trace(tmp_path / "trace.npz")
        argv = [trace if a.endswith(".npz") else a for a in argv]
        if "--synthetic" in argv:
            argv += ["--records", "256", "--k", "16", "--steps", "12", "--layers", "2", "--streams", "2"]
        warm = argv.index("--warm") if "--warm" in argv else None
        if warm is not None:
            argv[warm + 1] = "2"
        argv += ["--no-plots"]
    argv = [a for a in argv]
    if "--out" in argv:
        argv[argv.index("--out") + 1] = str(tmp_path / "out")
    elif argv[0] == "policies":
        argv += ["--out", str(tmp_path / "out")]
    assert cli.main(argv) == 0, capsys.readouterr().err


def test_every_macro_an_ab_sets_is_read_by_the_sources():
    """Each -DHISPARSE_X (and -Ccmake.define.HISPARSE_X) that benchmarks/gpu_run.sh builds a variant
    with is read by ffi/ (an #if / #ifdef / #ifndef of it, or a CMake option of that name): a misspelt
    name would build the default twice and time it as an A/B."""
    script = (ROOT / "benchmarks" / "gpu_run.sh").read_text()
    named = set(re.findall(r"-D(HISPARSE_[A-Z0-9_]+)", script))
    named |= set(re.findall(r"cmake\.define\.(HISPARSE_[A-Z0-9_]+)", script))
    assert "HISPARSE_TOPK_ALIGNED_SLICES" in named, sorted(named)
    sources = "\n".join(p.read_text() for p in sorted((ROOT / "ffi").rglob("*"))
                        if p.is_file() and p.suffix in {".h", ".cuh", ".cu", ".cc", ".txt"})
    read = set(re.findall(r"^\s*#\s*(?:if|ifdef|ifndef|elif)\b[^\n]*?\b(HISPARSE_[A-Z0-9_]+)", sources, flags=re.M))
    read |= set(re.findall(r"option\((HISPARSE_[A-Z0-9_]+)", sources))
    assert named <= read, f"gpu_run.sh builds with macros no source reads: {sorted(named - read)}"


def test_every_gpu_run_stage_is_documented():
    """benchmarks/gpu_run.sh's stages (its `case` labels) are each named in its own header and in
    docs/benchmarks.md's row for it, and neither names a stage the script does not have."""
    script = (ROOT / "benchmarks" / "gpu_run.sh").read_text()
    stages = set(re.findall(r"^    ([a-z0-9-]+)\)$", script, flags=re.M))
    assert {"build", "slices", "grouped-matmul", "attention-plans"} <= stages, stages
    header = set(re.findall(r"^#   ([a-z0-9-]+)(?:\s|$)", script, flags=re.M))
    header |= {s for line in re.findall(r"^#   (decode-[a-z-]+(?:, decode-[a-z-]+)*)$", script, flags=re.M)
               for s in line.split(", ")}
    assert stages <= header, f"stages without a line in gpu_run.sh's header: {sorted(stages - header)}"
    row = next(line for line in (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
               if line.startswith("| `benchmarks/gpu_run.sh OUT STAGE...`"))
    named = set(re.findall(r"`([a-z0-9-]+)`", row))
    assert stages <= named, f"stages missing from docs/benchmarks.md: {sorted(stages - named)}"
