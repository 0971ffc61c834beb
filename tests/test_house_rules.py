"""House rules checked on the source tree: no module reaches into another module's private names,
and a function over 80 lines says why it is long.

These rules keep modules replaceable one at a time (a private name can change without a search of
the tree) and keep long functions a decision rather than an accident.
"""

import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "hisparse_jax"
SOURCES = sorted(
    p for folder in ("hisparse_jax", "tests", "benchmarks", "bazel")
    for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)
MAX_LINES = 80
# The package's compiled extension modules, as the build names them.
EXTENSIONS = set(re.findall(r"nanobind_add_module\(\s*(\w+)", (ROOT / "ffi" / "CMakeLists.txt").read_text()))

pytestmark = pytest.mark.skipif(not PACKAGE.is_dir(), reason="needs the source tree")


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _package_module(module: str | None, level: int, path: pathlib.Path) -> bool:
    """Whether `from module import ...` names this package (its own private modules are its own)."""
    inside = PACKAGE in path.parents
    return inside and (level > 0 or (module or "").split(".")[0] == "hisparse_jax")


def _is_submodule(module: str | None, level: int, path: pathlib.Path, name: str) -> bool:
    base = path.parent
    for _ in range(max(level - 1, 0)):
        base = base.parent
    if level == 0:
        base = ROOT
        parts = (module or "").split(".")
    else:
        parts = module.split(".") if module else []
    target = base.joinpath(*parts, name)
    compiled = base == PACKAGE and name in EXTENSIONS  # built by CMake, installed beside the sources
    return target.with_suffix(".py").is_file() or (target / "__init__.py").is_file() or compiled


def private_name_uses(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found, module_names = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                module_names.add((alias.asname or alias.name).split(".")[0])
                if any(_private(part) for part in alias.name.split(".")) and not (
                        PACKAGE in path.parents and alias.name.startswith("hisparse_jax.")):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                module_names.add(alias.asname or alias.name)
                if not _private(alias.name):
                    continue
                own = _package_module(node.module, node.level, path) and _is_submodule(
                    node.module, node.level, path, alias.name)
                if not own:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module or '.'} "
                                 f"import {alias.name}")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in module_names):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def long_functions_without_reason(path: pathlib.Path) -> list[str]:
    lines = path.read_text().splitlines()
    tree = ast.parse("\n".join(lines), str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        if length <= MAX_LINES:
            continue
        first = node.body[0]
        if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant) and len(node.body) > 1:
            first = node.body[1]
        head = lines[node.lineno - 1:first.lineno]  # the signature, docstring and first statement
        if not any("#" in line and "long" in line.split("#", 1)[1].lower() for line in head):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_module_uses_another_modules_private_names():
    found = [use for path in SOURCES for use in private_name_uses(path)]
    assert not found, ("private names used across modules (make them public or keep them inside "
                       "their module):\n" + "\n".join(found))


def test_long_functions_say_why():
    found = [f for path in SOURCES for f in long_functions_without_reason(path)]
    assert not found, (f"functions over {MAX_LINES} lines without a '# ... long ...' comment at their "
                       "top saying why:\n" + "\n".join(found))
