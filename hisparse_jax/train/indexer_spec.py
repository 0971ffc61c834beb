"""`--indexer MODULE:NAME`: a researcher's indexer, found by name, and how a checkpoint names it.

MODULE is a dotted module (`my_lab.indexers`, importable from sys.path) or the path of a .py file
(`examples/my_indexer.py`, anywhere: it is imported under a private module name, so the file
needs no package around it). NAME is an attribute of that module: an `Indexer` instance, or a
callable taking no arguments that returns one (a class with defaults for every knob works).

A checkpoint records the class (MODULE:CLASS) and the dataclass fields (`describe`);
`from_record` rebuilds the same indexer from them, with the fields recorded (not the module's
current defaults), so a knob changed in the file after training cannot change the model.
Everything wrong is one line (ValueError) naming the spec and the fix: a module that is not
found or fails to import, a missing NAME, a value that is not an Indexer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path

from ..kit.protocol import Indexer

# The private module names of indexers imported from a file (load_indexer).
_FILE_MODULES = "hisparse_user_indexer_"
# Field values a checkpoint header may carry (JSON scalars): an indexer's knobs are sizes,
# flags and names, never arrays (those are its parameters, stored as weights).
_SCALARS = (bool, int, float, str, type(None))


def _split(spec: str) -> tuple[str, str]:
    if not isinstance(spec, str) or spec.count(":") < 1:
        raise ValueError(f"--indexer {spec!r}: expected MODULE:NAME (a dotted module or a .py file, then the "
                         "name of an Indexer or of a function returning one), e.g. examples/my_indexer.py:INDEXER")
    module, _, name = spec.rpartition(":")
    if not module or not name.isidentifier():
        raise ValueError(f"--indexer {spec!r}: expected MODULE:NAME with NAME a Python identifier, "
                         "e.g. my_lab.indexers:PAGE_MAX")
    return module, name


def _is_path(module: str) -> bool:
    return module.endswith(".py") or "/" in module or "\\" in module


def _import_file(spec: str, module: str):
    path = Path(module).expanduser()
    if not path.is_file():
        raise ValueError(f"--indexer {spec!r}: no such file {str(path)!r}; give the path of a .py file or a "
                         "dotted module importable from sys.path")
    resolved = path.resolve()
    # A private, stable module name per file: dataclasses and pickling look classes up in
    # sys.modules, and importing the same file twice returns the same classes.
    name = f"{_FILE_MODULES}{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, resolved)
    if loader_spec is None or loader_spec.loader is None:
        raise ValueError(f"--indexer {spec!r}: {str(path)!r} cannot be imported as a Python module")
    value = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = value
    try:
        loader_spec.loader.exec_module(value)
    except BaseException as err:
        del sys.modules[name]
        raise _import_error(spec, str(path), err) from None
    return value


def _import_error(spec: str, where: str, err: BaseException) -> ValueError:
    if isinstance(err, KeyboardInterrupt):
        raise err
    detail = " ".join(str(err).split())[:200]
    return ValueError(f"--indexer {spec!r}: importing {where} raised {type(err).__name__}: {detail}; fix the module")


def _import_module(spec: str, module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name is not None and (module == err.name or module.startswith(err.name + ".")):
            raise ValueError(f"--indexer {spec!r}: no module named {err.name!r}; give a dotted module importable "
                             "from sys.path (PYTHONPATH) or the path of a .py file") from None
        raise _import_error(spec, f"module {module!r}", err) from None
    except BaseException as err:
        raise _import_error(spec, f"module {module!r}", err) from None


def load_indexer(spec: str) -> Indexer:
    """The Indexer `spec` (MODULE:NAME) names; one-line ValueErrors otherwise."""
    module, name = _split(spec)
    value = _import_file(spec, module) if _is_path(module) else _import_module(spec, module)
    if not hasattr(value, name):
        public = sorted(n for n in vars(value) if not n.startswith("_"))
        found = [n for n in public if isinstance(getattr(value, n), Indexer)]
        hint = f"its Indexers: {', '.join(found)}" if found else "it defines no Indexer instance"
        raise ValueError(f"--indexer {spec!r}: {module} has no name {name!r} ({hint})")
    value = getattr(value, name)
    if not isinstance(value, Indexer) and callable(value):
        try:
            value = value()
        except Exception as err:
            detail = " ".join(str(err).split())[:200]
            raise ValueError(f"--indexer {spec!r}: calling {name}() raised {type(err).__name__}: {detail}; NAME "
                             "must be an Indexer or take no arguments and return one") from None
    if not isinstance(value, Indexer):
        raise ValueError(f"--indexer {spec!r}: {name} is a {type(value).__name__}, not an Indexer; subclass "
                         "hisparse_jax.kit.Indexer (or name a function returning an instance of one)")
    return value


def class_spec(indexer: Indexer) -> str:
    """MODULE:CLASS naming `indexer`'s class: the file's path for a module imported from a file
    (load_indexer's private names), the dotted module otherwise."""
    cls = type(indexer)
    module = sys.modules.get(cls.__module__)
    where = cls.__module__
    if where.startswith(_FILE_MODULES) and getattr(module, "__file__", None):
        where = module.__file__
    return f"{where}:{cls.__qualname__}"


def describe(indexer: Indexer) -> dict:
    """What a checkpoint records of `indexer`: MODULE:CLASS of its class, the class name and its
    fields (JSON scalars)."""
    fields = {}
    for f in dataclasses.fields(indexer):
        value = getattr(indexer, f.name)
        if not isinstance(value, _SCALARS):
            raise ValueError(f"{type(indexer).__name__}.{f.name}: is a {type(value).__name__}; a checkpoint "
                             "records an indexer's fields as numbers, strings, booleans or None")
        fields[f.name] = value
    return dict(spec=class_spec(indexer), class_name=type(indexer).__qualname__, fields=fields)


def _inside_package(spec: str) -> bool:
    module = spec.rpartition(":")[0]
    return not _is_path(module) and module.split(".")[0] == "hisparse_jax"


def from_record(record, where: str, spec: str | None = None) -> Indexer:
    """The indexer a checkpoint's header records (`describe`), rebuilt from its recorded class
    and fields. The recorded module is imported only inside hisparse_jax: a checkpoint's bytes
    do not choose code to run; `spec` (MODULE:NAME, the caller's) says where a researcher's
    module is, and must name the recorded class (its instance or the class itself). `where`
    names the checkpoint in errors."""
    if not isinstance(record, dict) or not isinstance(record.get("spec"), str) \
            or not isinstance(record.get("fields"), dict) or not isinstance(record.get("class_name"), str):
        raise ValueError(f"{where}: its header's indexer is not a {{spec, class_name, fields}} record")
    fields, recorded = record["fields"], record["spec"]
    if len(recorded) > 4096 or len(record["class_name"]) > 256:
        raise ValueError(f"{where}: its header's indexer names a module or class over 4096 / 256 characters")
    bad = [k for k, v in fields.items() if not isinstance(k, str) or not isinstance(v, _SCALARS)
           or len(k) > 256 or isinstance(v, str) and len(v) > 4096]
    if bad or len(fields) > 256:
        raise ValueError(f"{where}: its header's indexer fields are not a small map of names to scalars")
    if spec is None and not _inside_package(recorded):
        raise ValueError(f"{where}: was trained with the indexer {recorded}, code outside hisparse_jax that a "
                         f"checkpoint does not import by itself; pass --indexer {recorded} (or where that "
                         "module is now)")
    given = spec or recorded
    module, name = _split(given)
    value = _import_file(given, module) if _is_path(module) else _import_module(given, module)
    if not hasattr(value, name):
        raise ValueError(f"{where}: {module} has no name {name!r} (the checkpoint's indexer is a "
                         f"{record['class_name']})")
    found = getattr(value, name)
    cls = found if isinstance(found, type) else type(found)
    if not issubclass(cls, Indexer) or cls.__qualname__ != record["class_name"]:
        raise ValueError(f"{where}: was trained with the indexer class {record['class_name']}; {given} is a "
                         f"{cls.__qualname__ if isinstance(found, type) else type(found).__name__}")
    unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(cls)})
    if unknown:
        raise ValueError(f"{where}: its indexer fields {', '.join(unknown)} are not fields of {cls.__qualname__} "
                         "any more; restore them or retrain")
    try:
        return cls(**fields)
    except Exception as err:
        detail = " ".join(str(err).split())[:200]
        raise ValueError(f"{where}: its indexer fields do not make a {cls.__qualname__} "
                         f"({type(err).__name__}: {detail})") from None
