"""Training any protocol indexer (hisparse_jax.train): `--indexer MODULE:NAME` finds it or says in
one line why not, checkpoints record it and rebuild it from their own record, and a checkpoint
does not import a researcher's code by itself."""

from __future__ import annotations

import io
import json
import zipfile

import jax
import numpy as np
import pytest

from hisparse_jax import kit
from hisparse_jax.kit.page_minmax import PageMinMax
from hisparse_jax.models import dsa
from hisparse_jax.train import __main__ as train_cli
from hisparse_jax.train import fit as fit_lib
from hisparse_jax.train.checkpoint import load_model, save_model
from hisparse_jax.train.forward import forward_loss
from hisparse_jax.train.indexer_spec import load_indexer

INDEXER_FILE = '''
import dataclasses
import jax.numpy as jnp
from hisparse_jax import layout
from hisparse_jax.kit.page_minmax import PageMinMax
from hisparse_jax.models import dsa

@dataclasses.dataclass(frozen=True)
class Wide(PageMinMax):
    """A researcher's subclass: a knob of its own."""
    scale: float = 1.0

WIDE = Wide(page=16, dim=8, heads=2)
def make():
    return Wide(page=32, dim=8, heads=2, scale=2.0)
def broken():
    raise RuntimeError("no GPU here")
NOT_AN_INDEXER = 3
'''


@pytest.fixture()
def user_file(tmp_path):
    path = tmp_path / "lab" / "my_wide.py"
    path.parent.mkdir()
    path.write_text(INDEXER_FILE)
    return path


def test_a_spec_names_an_instance_or_a_function_in_a_file_or_a_module(user_file):
    assert load_indexer(f"{user_file}:WIDE").page == 16
    made = load_indexer(f"{user_file}:make")
    assert (made.page, made.scale) == (32, 2.0)
    assert type(made) is type(load_indexer(f"{user_file}:WIDE"))  # one module per file, imported once
    assert load_indexer("hisparse_jax.kit.page_minmax:PageMinMax") == PageMinMax()


@pytest.mark.parametrize("spec, message", [
    ("no_colon", "expected MODULE:NAME"),
    ("hisparse_jax.kit.page_minmax:", "expected MODULE:NAME"),
    ("no_such_module_xyz:X", "no module named 'no_such_module_xyz'"),
    ("missing/dir/mine.py:X", "no such file 'missing/dir/mine.py'"),
    ("{file}:NOPE", "has no name 'NOPE' (its Indexers: WIDE)"),
    ("{file}:NOT_AN_INDEXER", "NOT_AN_INDEXER is a int, not an Indexer"),
    ("{file}:broken", "calling broken() raised RuntimeError: no GPU here"),
    ("{bad}:X", "raised SyntaxError"),
])
def test_a_bad_spec_is_one_line_exit_2_before_any_work(spec, message, user_file, tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("def (:\n")
    spec = spec.format(file=user_file, bad=bad)
    assert train_cli.main(["fit", "--indexer", spec, "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and err.startswith("hisparse_jax.train: error: --indexer"), err
    assert not (tmp_path / "never").exists()


def test_the_forward_trains_a_kit_indexer_by_its_train_scores():
    config = fit_lib.model_config("tiny", PageMinMax(page=16, dim=8, heads=2))
    assert isinstance(config, kit.Config) and not hasattr(config, "index_dim")
    weights = kit.family(config.indexer).init_weights(config, 0)
    tokens = jax.numpy.asarray(np.random.default_rng(0).integers(0, 256, (2, 65)), jax.numpy.int32)
    # Jitted, as fit runs them: one compile each instead of an eager op-by-op forward and
    # backward (30 s of dispatch and per-op compiles on XLA:CPU); the same values are checked.
    loss, parts = jax.jit(lambda w: forward_loss(config, w, tokens, sparse=False, chunk=32, measure=True))(weights)
    assert np.isfinite(float(loss)) and np.all(np.asarray(parts["kl"]) > 0)
    # every query past top_k has keys left out: the top-k keeps part of the attention's mass
    assert np.all((np.asarray(parts["captured"]) > 0) & (np.asarray(parts["captured"]) < 1))
    (loss, parts), grads = jax.jit(jax.value_and_grad(
        lambda w: forward_loss(config, w, tokens, sparse=True, chunk=32), has_aux=True))(weights)
    assert np.isfinite(float(loss)) and np.all(np.asarray(parts["kl"]) > 0)
    assert all(float(np.abs(g).sum()) > 0 for g in jax.tree.leaves(grads.indexers))  # the KL trains the indexer


def _saved(tmp_path, indexer):
    config = fit_lib.model_config("tiny", indexer)
    weights = kit.family(indexer).init_weights(config, 1)
    save_model(tmp_path / "m.npz", config, weights, dict(note="x"))
    return config, weights


def test_a_checkpoint_records_its_indexer_and_loads_it_back(tmp_path):
    config, weights = _saved(tmp_path, PageMinMax(page=16, dim=8, heads=2))
    loaded, back, meta = load_model(tmp_path / "m.npz", max_context=256)
    assert loaded.indexer == config.indexer and loaded.max_context == 256 and meta == dict(note="x")
    for a, b in zip(jax.tree.leaves(weights), jax.tree.leaves(back)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_a_researchers_indexer_is_rebuilt_from_the_checkpoints_fields_where_the_caller_says(tmp_path, user_file):
    indexer = load_indexer(f"{user_file}:make")
    _saved(tmp_path, indexer)
    with pytest.raises(ValueError, match=r"code outside hisparse_jax .* pass --indexer .*my_wide.py:Wide"):
        load_model(tmp_path / "m.npz")
    # the fields come from the checkpoint, not from the spec's instance (WIDE has page 16)
    loaded, _, _ = load_model(tmp_path / "m.npz", indexer=f"{user_file}:WIDE")
    assert (loaded.indexer.page, loaded.indexer.scale) == (32, 2.0)
    with pytest.raises(ValueError, match="trained with the indexer class Wide; hisparse_jax.kit.page_minmax"):
        load_model(tmp_path / "m.npz", indexer="hisparse_jax.kit.page_minmax:PageMinMax")


def _rewrite_header(path, change):
    with zipfile.ZipFile(path) as z:
        members = {n: z.read(n) for n in z.namelist()}
    header = json.loads(np.lib.format.read_array(io.BytesIO(members["header.npy"])).tobytes())
    change(header)
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, np.frombuffer(json.dumps(header).encode(), np.uint8))
    members["header.npy"] = buffer.getvalue()
    with zipfile.ZipFile(path, "w") as z:
        for n, data in members.items():
            z.writestr(n, data)


@pytest.mark.parametrize("change, message", [
    (lambda h: h["indexer"]["fields"].update(page=32), "content hash does not match"),
    (lambda h: h["indexer"].update(spec="os:getcwd"), "code outside hisparse_jax"),
    (lambda h: h.update(indexer=[1, 2]), "is not a {spec, class_name, fields} record"),
    (lambda h: h["indexer"]["fields"].update(page=[1]), "not a small map of names to scalars"),
    (lambda h: h["indexer"]["fields"].update(colour="red"), "fields colour are not fields of PageMinMax"),
    (lambda h: h["indexer"].update(class_name="Other"), "trained with the indexer class Other"),
    (lambda h: h["indexer"].update(class_name="C" * 10**6), "over 4096 / 256 characters"),
    (lambda h: h["indexer"]["fields"].update(page="x" * 10**5), "not a small map of names to scalars"),
])
def test_a_changed_indexer_record_is_one_line(tmp_path, change, message, capsys):
    _saved(tmp_path, PageMinMax(page=16, dim=8, heads=2))
    _rewrite_header(tmp_path / "m.npz", change)
    with pytest.raises(ValueError, match=message) as err:
        load_model(tmp_path / "m.npz")
    assert "\n" not in str(err.value)
    assert train_cli.main(["record", "--checkpoint", str(tmp_path / "m.npz"), "--out", str(tmp_path / "t.npz")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_dsa_checkpoint_takes_no_indexer(tmp_path):
    config = fit_lib.model_config("tiny")
    save_model(tmp_path / "d.npz", config, dsa.init_weights(config, 0))
    with pytest.raises(ValueError, match="is a DSA checkpoint .* drop --indexer"):
        load_model(tmp_path / "d.npz", indexer="hisparse_jax.kit.page_minmax:PageMinMax")


def test_sparse_training_needs_train_scores(tmp_path):
    class_file = tmp_path / "scoreless.py"
    class_file.write_text(INDEXER_FILE + '''
@dataclasses.dataclass(frozen=True)
class Scoreless(PageMinMax):
    def train_scores(self, config, params, h, positions, start, chunk):
        return None
SCORELESS = Scoreless(page=16, dim=8, heads=2)
''')
    config = fit_lib.model_config("tiny", load_indexer(f"{class_file}:SCORELESS"))
    with pytest.raises(ValueError, match="train_scores: returned None, so sparse attention has no scores"):
        forward_loss(config, kit.family(config.indexer).init_weights(config, 0),
                     jax.numpy.zeros((1, 33), jax.numpy.int32), sparse=True, chunk=32)
