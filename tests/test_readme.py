"""The README's API example runs as written (on whatever backend the tests run on)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_api_example_runs_as_written():
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "hs.resolve(" in b)
    namespace: dict = {}
    exec(compile(example, str(README), "exec"), namespace)  # its own assert checks the records
    assert int(namespace["misses"].sum()) == 2 * 64
