"""A small text corpus from the Python standard library, shared by the training tests and the
research kit's example pipeline (the `text_root` fixture of tests/conftest.py)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# A few standard-library modules, one of them long enough to be decoded by the recorder.
FILES = ("argparse.py", "dataclasses.py", "typing.py", "functools.py", "enum.py", "inspect.py", "pathlib.py",
         "textwrap.py", "random.py", "string.py", "glob.py", "shlex.py")


def copy_to(root: Path) -> Path:
    """`root` (created) holding a copy of FILES."""
    root.mkdir(parents=True)
    for name in FILES:
        (root / name).write_bytes((STDLIB / name).read_bytes())
    return root
