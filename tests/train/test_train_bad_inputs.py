"""Bad inputs to the training side, each refused in one line naming the argument (or the file and
field) and the fix, with exit status 2 from the CLI: a checkpoint's meta (checked field by field,
and inside the content hash), non-finite weights, a checkpoint declaring huge weights with a bad
hash (refused without allocating them), record's and fit's flags, and the --roots reader."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from hisparse_jax.models import dsa
from hisparse_jax.train import __main__ as train_cli
from hisparse_jax.train import fit as fit_lib
from hisparse_jax.train.checkpoint import check_meta, content_hash, load_model, save_model
from hisparse_jax.train.corpus import read_documents


def _meta() -> dict:
    """A meta as fit writes it."""
    return dict(model="tiny", plan=dataclasses.asdict(fit_lib.PLANS["tiny"]), data="byte-level; text",
                train_documents=10, held_out_documents=2,
                summary=dict(train_seconds=1.5, tokens_seen=1536, phases=[], eval_seq_len=64, eval_windows=2),
                device="cpu", jax="0", date="2026-12-05")


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    config = fit_lib.model_config("tiny")
    path = tmp_path_factory.mktemp("ckpt") / "m.npz"
    save_model(path, config, dsa.init_weights(config, 1), _meta())
    return path


def _members(path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {n: f[n] for n in f.files}


def _rewrite(src, dst, change, rehash=True, **arrays):
    """src with its header changed by change(header) and arrays replaced; with rehash, the content
    hash recomputed (the file is self-consistent: only the field checks can refuse it)."""
    members = {**_members(src), **arrays}
    header = json.loads(members.pop("header").tobytes())
    change(header)
    if rehash:
        header["sha256"] = content_hash(header, [members[f"w{i:04d}"] for i in range(len(members))])
    np.savez_compressed(dst, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **members)
    return dst


def _set(path: str, value):
    """A header change: meta's field at the dotted path (meta.plan.chunk) set to value."""
    def change(header):
        keys = path.split(".")
        node = header
        for key in keys[:-1]:
            node = node[key]
        if value is KeyError:
            del node[keys[-1]]
        else:
            node[keys[-1]] = value
    return change


def _refused(path, needle, **kwargs):
    with pytest.raises(ValueError) as err:
        load_model(path, **kwargs)
    message = str(err.value)
    assert needle in message and "\n" not in message and str(path) in message, message
    return message


def _cli(argv, capsys) -> str:
    assert train_cli.main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hisparse_jax.train: error:") and "Traceback" not in err, err
    return err


# 1. meta: checked field by field, and inside the content hash

BAD_META = [
    ("meta", [1], "its meta is [1], expected an object"),
    ("meta.plan", "x", 'meta.plan is "x", expected an object'),
    ("meta.plan.eval_batches", 10**7, "meta.plan.eval_batches is 10000000, expected an int in [1, 1024]"),
    ("meta.plan.eval_batches", 0, "meta.plan.eval_batches is 0, expected an int in [1, 1024]"),
    ("meta.plan.eval_batches", KeyError, "meta.plan.eval_batches is missing"),
    ("meta.plan.chunk", 3.7, "meta.plan.chunk is 3.7, expected an int in [1, 2^20]"),
    ("meta.plan.chunk", 0, "meta.plan.chunk is 0, expected an int"),
    ("meta.plan.chunk", 48, "meta.plan.chunk is 48, which does not divide meta.plan.eval_seq_len 64"),
    ("meta.plan.eval_seq_len", -5, "meta.plan.eval_seq_len is -5, expected an int in [1, 2^20]"),
    ("meta.plan.eval_seq_len", "abc", 'meta.plan.eval_seq_len is "abc", expected an int'),
    ("meta.plan.eval_seq_len", 10**8, "meta.plan.eval_seq_len is 100000000, expected an int in [1, 2^20]"),
    ("meta.plan.eval_seq_len", True, "meta.plan.eval_seq_len is true, expected an int"),
    ("meta.plan.seed", -1, "meta.plan.seed is -1, expected an int in [0, 2^31 - 1]"),
    ("meta.plan.seed", 10**30, "meta.plan.seed is 1000000000000000000000000000000, expected an int in [0, 2^31 - 1]"),
    ("meta.plan.phases", {"a": 1}, "meta.plan.phases is {\"a\": 1}, expected a list"),
    ("meta.summary", [1], "meta.summary is [1], expected an object"),
    ("meta.summary.train_seconds", float("nan"), "meta.summary.train_seconds is NaN, expected a finite number >= 0"),
    ("meta.model", 5, "meta.model is 5, expected a string"),
    ("meta.model", "trace-model", "meta.model is 'trace-model' but its config's d_model is 64"),
    ("meta.train_documents", -1, "meta.train_documents is -1, expected an int"),
]


@pytest.mark.parametrize("field, value, message", BAD_META, ids=[f"{f}={v!r}"[:60] for f, v, _ in BAD_META])
def test_a_bad_meta_is_refused_naming_the_field(saved, tmp_path, field, value, message):
    path = _rewrite(saved, tmp_path / "bad.npz", _set(field, value))
    _refused(path, message)


def test_a_phase_field_of_the_wrong_type_is_named(saved, tmp_path):
    def change(header):
        header["meta"]["plan"]["phases"][1]["steps"] = 2.5
    _refused(_rewrite(saved, tmp_path / "bad.npz", change), "meta.plan.phases[1].steps is 2.5, expected an int")


def test_the_cli_refuses_a_bad_meta_in_one_line(saved, tmp_path, capsys):
    """record exited 0 with these, writing the meta into the trace."""
    for field, value, message in [("meta.plan.eval_batches", 10**7, "expected an int in [1, 1024]"),
                                  ("meta.plan.chunk", 3.7, "meta.plan.chunk is 3.7"),
                                  ("meta.summary", [1], "meta.summary is [1]")]:
        path = _rewrite(saved, tmp_path / "bad.npz", _set(field, value))
        err = _cli(["record", "--checkpoint", path, "--documents", "1", "--prefill", "64", "--steps", "4",
                    "--out", tmp_path / "t.npz"], capsys)
        assert message in err and str(path) in err


def test_meta_is_inside_the_content_hash(saved, tmp_path):
    header = json.loads(_members(saved)["header"].tobytes())
    assert header["sha256_covers"] == "config, indexer, meta, weights"
    _refused(_rewrite(saved, tmp_path / "m.npz", _set("meta.date", "2030-01-01"), rehash=False),
             "content hash does not match")
    _refused(_rewrite(saved, tmp_path / "c.npz", _set("sha256_covers", "config"), rehash=False),
             "its header's sha256_covers is \"config\"")


def test_a_file_hashed_before_meta_was_covered_loads_and_its_meta_is_still_checked(saved, tmp_path):
    """Checkpoints written before sha256_covers: the hash covers config and weights; meta is checked."""
    path = _rewrite(saved, tmp_path / "old.npz", _set("sha256_covers", KeyError))
    assert load_model(path)[2]["plan"]["chunk"] == 32

    def old_and_bad(header):
        del header["sha256_covers"]
        header["meta"]["plan"]["chunk"] = 0
    _refused(_rewrite(saved, tmp_path / "oldbad.npz", old_and_bad), "meta.plan.chunk is 0")


def test_save_model_refuses_a_meta_load_model_would_refuse(tmp_path):
    config = fit_lib.model_config("tiny")
    with pytest.raises(ValueError, match=r"meta.plan.eval_batches is 0, expected an int in \[1, 1024\]"):
        save_model(tmp_path / "m.npz", config, dsa.init_weights(config, 1),
                   {**_meta(), "plan": {**_meta()["plan"], "eval_batches": 0}})
    assert not (tmp_path / "m.npz").exists()
    assert check_meta({}, "x") == {}


def test_train_plans_are_held_to_the_bounds_of_a_checkpoints_meta():
    with pytest.raises(ValueError, match=r"TrainPlan.eval_batches must be an int in \[1, 1024\]"):
        dataclasses.replace(fit_lib.PLANS["tiny"], eval_batches=10**7)
    with pytest.raises(ValueError, match="TrainPlan.chunk must be an int"):
        dataclasses.replace(fit_lib.PLANS["tiny"], chunk=0)
    with pytest.raises(ValueError, match="TrainPlan.seed must be an int"):
        dataclasses.replace(fit_lib.PLANS["tiny"], seed=2**63)
    with pytest.raises(ValueError, match="lr must be a finite number"):
        fit_lib.Phase("x", "dense", steps=1, seq_len=32, batch=1, lr=math.nan)
    with pytest.raises(ValueError, match=r"steps must be an int in \[1, 2\^31 - 1\], got True"):
        fit_lib.Phase("x", "dense", steps=True, seq_len=32, batch=1)


# 2. a checkpoint declaring huge weights with a bad hash: refused before they are allocated

def test_huge_declared_weights_with_a_bad_hash_are_refused_without_allocating_them(saved, tmp_path):
    """A config of vocab 2^19 declares 2 x 128 MiB of (zero, so highly compressed) weights: the hash
    is computed as the file is read, in pieces, and the weights are never allocated."""
    config = fit_lib.model_config("tiny", vocab=2**19)
    zeros = dict(embed=np.zeros((2**19, config.d_model), np.float32),
                 unembed=np.zeros((config.d_model, 2**19), np.float32))
    members = _members(saved)
    header = json.loads(members.pop("header").tobytes())
    header["config"]["vocab"] = 2**19
    del header["meta"]["model"]
    for i, name in enumerate(header["leaves"]):
        key = name.strip(".[]'")
        if key in zeros:
            assert members[f"w{i:04d}"].shape != zeros[key].shape
            members[f"w{i:04d}"] = zeros[key]
    path = tmp_path / "big.npz"
    np.savez_compressed(path, header=np.frombuffer(json.dumps(header).encode(), np.uint8), **members)
    assert path.stat().st_size < 4 << 20
    tracemalloc.start()
    try:
        _refused(path, "content hash does not match")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, peak  # the 16 MiB pieces, not the 256 MiB of weights


# 3. non-finite weights

@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_in_one_line(tmp_path, capsys, dtype, bad):
    """record exited 0 with these, writing an all-padding trace with 'decode loss nan'."""
    config = fit_lib.model_config("tiny", dtype=dtype)
    weights = dsa.init_weights(config, 1)
    weights = dataclasses.replace(weights, embed=weights.embed.at[3, 5].set(bad))
    path = tmp_path / "nan.npz"
    save_model(path, config, weights)  # a self-consistent file: its hash covers the NaN
    _refused(path, "weight w0000 (.embed) holds 1 NaN or infinite values of 16384")
    err = _cli(["record", "--checkpoint", path, "--documents", "1", "--prefill", "64", "--steps", "4",
                "--out", tmp_path / "t.npz"], capsys)
    assert "NaN or infinite" in err and not (tmp_path / "t.npz").exists()


def test_finite_extremes_load(tmp_path):
    config = fit_lib.model_config("tiny")
    weights = dsa.init_weights(config, 1)
    weights = dataclasses.replace(weights, embed=weights.embed.at[0, 0].set(np.finfo(np.float32).max))
    save_model(tmp_path / "m.npz", config, weights)
    load_model(tmp_path / "m.npz")


# 4, 5, 7. the flags: named with their range, before any checkpoint or corpus is read

@pytest.mark.parametrize("argv, message", [
    (["--prefill", "99999999999999999999"],
     "argument --prefill: expected an int in [1, 2^30], got 99999999999999999999"),
    (["--steps", "99999999999999999999"], "argument --steps: expected an int in [1, 2^30]"),
    (["--prefill", "1073741800", "--steps", "100"], "--prefill 1073741800 + --steps 100 is more than 2^30 tokens"),
    (["--top-k", "0"], "argument --top-k: expected an int in [1, 2^30], got 0"),
    (["--top-k", "-5"], "argument --top-k: expected an int in [1, 2^30], got -5"),
    (["--top-k", "99999999999999999999"], "argument --top-k: expected an int in [1, 2^30]"),
    (["--top-k", "100"], "--top-k 100 is more than --prefill 64: the prefill must hold top-k records"),
    (["--documents", "0"], "argument --documents: expected an int in [1, 2^16], got 0"),
    (["--documents", "x" * 5000], "argument --documents: expected an int in [1, 2^16], got 'xxxx"),
])
def test_record_flags_are_named_with_their_range(saved, tmp_path, capsys, argv, message):
    """They blamed the checkpoint ('its config does not make a model'), or advised a flag record
    does not have ('raise hot_slots')."""
    base = ["record", "--checkpoint", saved, "--prefill", "64", "--steps", "4", "--out", tmp_path / "t.npz"]
    err = _cli(base + argv, capsys)
    assert message in err and "does not make a model" not in err and "hot_slots" not in err


@pytest.mark.parametrize("argv, message", [
    (["--seed", str(2**63)], "argument --seed: expected an int in [0, 2^31 - 1] (the weights' PRNG seed is an int32), "
                             "got 9223372036854775808"),
    (["--seed", str(2**31)], "argument --seed: expected an int in [0, 2^31 - 1]"),
    (["--seed", "9" * 5000], "argument --seed: expected an int in [0, 2^31 - 1], got '999"),
    (["--time-scale", "inf"], "argument --time-scale: expected a number in (0, 1e6], got inf"),
    (["--time-scale", "nan"], "argument --time-scale: expected a number in (0, 1e6], got nan"),
    (["--time-scale", "1e300"], "argument --time-scale: expected a number in (0, 1e6]"),
    (["--max-steps", "99999999999999999999"], "argument --max-steps: expected an int in [1, 2^31 - 1]"),
    (["--out", ""], "argument --out: an empty path; give a folder"),
    (["--roots", ""], "argument --roots: an empty path; give a folder of text files"),
])
def test_fit_flags_are_named_with_their_range(tmp_path, capsys, argv, message):
    """--seed 2^63 was an OverflowError traceback; --time-scale inf and --out "" trained (into the
    current folder for the latter)."""
    base = ["fit", "--model", "tiny", "--max-steps", "1", "--out", tmp_path / "fit"]
    err = _cli(base + argv, capsys)
    assert message in err and not (tmp_path / "fit").exists()


def test_record_out_and_checkpoint_may_not_be_empty(saved, tmp_path, capsys):
    assert "argument --out: an empty path; give a file name" in _cli(
        ["record", "--checkpoint", saved, "--out", ""], capsys)
    assert "argument --checkpoint: an empty path" in _cli(
        ["record", "--checkpoint", "", "--out", tmp_path / "t.npz"], capsys)


# 6. --roots: regular files, each read within a bound, every failure one line naming the file

def _text(path: Path, size: int = 400) -> Path:
    path.write_bytes(b"x = 1\n" * (size // 6))
    return path


def test_a_file_larger_than_a_document_may_be_is_refused_unread(tmp_path, capsys):
    """A 7 GB sparse .txt was read whole (MemoryError); now its size refuses it before a read."""
    _text(tmp_path / "a.py")
    with open(tmp_path / "zz_big.txt", "wb") as f:
        f.truncate((64 << 20) + 1)
    with pytest.raises(ValueError, match=r"zz_big.txt' is 67108865 bytes, more than 64 MiB"):
        read_documents([tmp_path])
    err = _cli(["fit", "--model", "tiny", "--max-steps", "1", "--roots", tmp_path, "--out", tmp_path / "o"], capsys)
    assert "zz_big.txt" in err and "more than a document may" in err


def test_a_document_and_the_corpus_are_bounded(tmp_path):
    _text(tmp_path / "a.py", 2000)
    with pytest.raises(ValueError, match="a.py' is 1998 bytes, more than 1000 bytes, more than a document may"):
        read_documents([tmp_path], max_bytes=1000)
    _text(tmp_path / "b.py", 800)
    with pytest.raises(ValueError, match="hold more than 2500 bytes, more than a corpus may; give fewer or smaller"):
        read_documents([tmp_path], max_bytes=4000, max_total=2500)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="Linux /proc")
def test_the_read_is_capped_when_the_size_says_less(tmp_path):
    """/proc files report size 0: the read itself stops at max_bytes + 1."""
    _text(tmp_path / "a.py")
    (tmp_path / "maps.txt").symlink_to("/proc/self/maps")
    with pytest.raises(ValueError, match="maps.txt' holds more than 1000 bytes, more than a document may"):
        read_documents([tmp_path], max_bytes=1000)


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="Linux /proc")
def test_an_unreadable_file_is_one_line_naming_it(tmp_path, capsys):
    """A .txt link to /proc/self/mem raised OSError (EIO) as a traceback."""
    _text(tmp_path / "a.py")
    (tmp_path / "zz_mem.txt").symlink_to("/proc/self/mem")
    with pytest.raises(ValueError, match=r"corpus: '.*zz_mem.txt' cannot be read \(OSError: Input/output error\)"):
        read_documents([tmp_path])
    err = _cli(["record", "--checkpoint", tmp_path / "missing.npz", "--out", tmp_path / "t.npz"], capsys)
    assert "no such file" in err  # (the checkpoint is refused before the corpus is read)
    err = _cli(["fit", "--model", "tiny", "--max-steps", "1", "--roots", tmp_path, "--out", tmp_path / "o"], capsys)
    assert "zz_mem.txt' cannot be read" in err


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_files_that_are_not_regular_are_skipped_unopened(tmp_path):
    """A FIFO named .txt would block a read forever; a broken link names nothing."""
    _text(tmp_path / "a.py")
    os.mkfifo(tmp_path / "pipe.txt")
    (tmp_path / "gone.md").symlink_to(tmp_path / "nothing")
    assert [d.name for d in read_documents([tmp_path])] == [f"{tmp_path.name}/a.py"]


def test_a_folder_without_documents_says_why_its_files_were_skipped(tmp_path, capsys):
    """It said 'no text files' of a folder holding text files too short or binary."""
    (tmp_path / "short.py").write_bytes(b"x = 1\n")
    (tmp_path / "bin.txt").write_bytes(b"\0" * 1000)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "pipe.md")
    fifo = 1 if hasattr(os, "mkfifo") else 0
    with pytest.raises(ValueError) as err:
        read_documents([tmp_path])
    message = str(err.value)
    assert f"none of the {2 + fifo} files named *.py, *.txt, *.rst, *.md under {tmp_path} is a document" in message
    assert "1 are shorter than 256 bytes, 1 hold a NUL byte (binary)" in message
    assert f"{fifo} are not regular files" in message and "no text files" not in message
    err = _cli(["fit", "--model", "tiny", "--max-steps", "1", "--roots", tmp_path, "--out", tmp_path / "o"], capsys)
    assert "1 are shorter than 256 bytes" in err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"no text files \(.py, .txt, .rst, .md\) under"):
        read_documents([empty])

