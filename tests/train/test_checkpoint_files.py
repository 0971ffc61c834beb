"""Checkpoints from untrusted bytes (hisparse_jax.train.checkpoint.load_model): a content hash, each
weight's dtype and shape checked against the config, one line naming the file for whatever is
wrong, and the train CLI's exit 2."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import bad_npz
from hisparse_jax.models import dsa
from hisparse_jax.train import __main__ as train_cli
from hisparse_jax.train import fit as fit_lib
from hisparse_jax.train.checkpoint import load_model, save_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    config = fit_lib.model_config("tiny", dtype="bfloat16")
    path = tmp_path_factory.mktemp("ckpt") / "m.npz"
    save_model(path, config, dsa.init_weights(config, 1), dict(note="x"))
    return path


def _members(path) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {n: f[n] for n in f.files}


def _rewrite(src, dst, header_changes=None, **arrays):
    members = _members(src)
    header = json.loads(members["header"].tobytes())
    for key, value in (header_changes or {}).items():
        if key == "config":
            header["config"] = {**header["config"], **value}
        elif value is None:
            header.pop(key)
        else:
            header[key] = value
    np.savez_compressed(dst, **{**members, **arrays, "header": np.frombuffer(json.dumps(header).encode(), np.uint8)})
    return dst


def _refused(path, needle):
    with pytest.raises(ValueError) as err:
        load_model(path)
    assert needle in str(err.value) and "\n" not in str(err.value) and str(path) in str(err.value), str(err.value)


def test_a_saved_checkpoint_carries_its_hash_and_loads(saved, capsys):
    header = json.loads(_members(saved)["header"].tobytes())
    assert len(header["sha256"]) == 64
    _, _, meta = load_model(saved)
    assert meta == dict(note="x") and capsys.readouterr().err == ""


def test_the_header_dtype_changed_to_float32_is_refused(saved, tmp_path):
    """The bf16 bit patterns must not load as uint16 numbers (largest weight 48,935, not 1.3)."""
    path = _rewrite(saved, tmp_path / "f32.npz", dict(config=dict(dtype="float32")))
    _refused(path, "is uint16 [")


@pytest.mark.parametrize("dtype", [np.bool_, np.int64])
def test_weights_of_another_dtype_are_refused_not_cast(saved, tmp_path, dtype):
    w = _members(saved)["w0000"]
    path = _rewrite(saved, tmp_path / "bad.npz", w0000=np.zeros(w.shape, dtype))
    _refused(path, "weight w0000")


def test_a_weight_of_another_shape_is_refused(saved, tmp_path):
    w = _members(saved)["w0001"]
    _refused(_rewrite(saved, tmp_path / "shape.npz", w0001=w.reshape(-1)[: w.size // 2]), "weight w0001")


def test_a_changed_weight_fails_the_hash(saved, tmp_path):
    w = _members(saved)["w0002"].copy()
    w.reshape(-1)[0] ^= 1
    _refused(_rewrite(saved, tmp_path / "flip.npz", w0002=w), "content hash does not match")
    _refused(_rewrite(saved, tmp_path / "meta.npz", dict(config=dict(rope_theta=1.0))), "content hash does not match")


def test_a_checkpoint_without_a_hash_loads_with_a_warning(saved, tmp_path, capsys):
    path = _rewrite(saved, tmp_path / "old.npz", dict(sha256=None))
    load_model(path)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "carries no content hash" in err


def test_bad_bytes_are_one_line(saved, tmp_path):
    data = saved.read_bytes()
    (tmp_path / "cut.npz").write_bytes(data[: len(data) // 3])
    _refused(tmp_path / "cut.npz", "not a .npz archive")
    (tmp_path / "empty.npz").write_bytes(b"")
    _refused(tmp_path / "empty.npz", "not a .npz archive")
    (tmp_path / "dir.npz").mkdir()
    _refused(tmp_path / "dir.npz", "is a directory")
    _refused(_rewrite(saved, tmp_path / "fmt.npz", dict(format="other")), "not a hisparse-dsa-checkpoint file")
    _refused(_rewrite(saved, tmp_path / "cfg.npz", dict(config=dict(d_model=-3))), "does not make a model")


def test_the_train_cli_refuses_a_bad_checkpoint_in_one_line(saved, tmp_path, capsys):
    (tmp_path / "cut.npz").write_bytes(saved.read_bytes()[:100])
    assert train_cli.main(["record", "--checkpoint", str(tmp_path / "cut.npz"), "--out", str(tmp_path / "t.npz"),
                           "--roots", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a .npz archive" in err and "Traceback" not in err


@pytest.mark.parametrize("kind", sorted(bad_npz.KINDS))
def test_every_kind_of_bad_file_is_one_line(saved, tmp_path, kind):
    _refused(bad_npz.make(kind, saved, tmp_path, "w0000"), bad_npz.KINDS[kind])


@pytest.mark.parametrize("kind", sorted(bad_npz.KINDS))
def test_the_train_cli_refuses_every_kind_of_bad_checkpoint_in_one_line(saved, tmp_path, capsys, kind):
    path = bad_npz.make(kind, saved, tmp_path, "w0000")
    assert train_cli.main(["record", "--checkpoint", str(path), "--out", str(tmp_path / "t.npz"),
                           "--roots", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and bad_npz.KINDS[kind] in err and "Traceback" not in err, err


def test_a_header_nested_too_deep_is_one_line(saved, tmp_path):
    members = {**_members(saved), "header": np.frombuffer(b"[" * 100_000 + b"]" * 100_000, np.uint8)}
    np.savez_compressed(tmp_path / "deep.npz", **members)
    _refused(tmp_path / "deep.npz", "its header is not JSON (RecursionError")


def test_a_config_declaring_more_weights_than_max_bytes_is_refused_before_reading_them(saved, tmp_path):
    """A few KB whose header declares a model of 2^31 - 1 vocab x 64: its weights are neither read
    nor allocated (max_bytes, 16 GiB by default, bounds what the config may declare)."""
    path = _rewrite(saved, tmp_path / "big.npz", dict(config=dict(vocab=2**31 - 1)))
    _refused(path, "GiB of weights, more than max_bytes")
    with pytest.raises(ValueError, match="more than max_bytes = 0.0 GiB"):
        load_model(saved, max_bytes=1000)


def test_config_sizes_beyond_int32_are_refused(saved, tmp_path):
    _refused(_rewrite(saved, tmp_path / "wide.npz", dict(config=dict(d_model=2**40))), "up to 2^31 - 1")
