"""One line per finished test file when the suite runs on several workers (pytest-xdist), where
pytest itself prints only dots: `tests/x.py: 12 passed, 2 skipped (41/112 files)`.

Loaded by conftest.py; with one process pytest's own per-file lines stay and this prints nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict


class FileProgress:
    def __init__(self, config):
        self.config = config
        self.pending: dict[str, set[str]] = {}  # file -> test ids not yet reported
        self.outcomes: dict[str, Counter] = defaultdict(Counter)
        self.files_done = 0

    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.pending:  # every worker collects the same ids; the first list is enough
            return
        for nodeid in ids:
            self.pending.setdefault(nodeid.split("::")[0], set()).add(nodeid)

    def pytest_runtest_logreport(self, report):
        path = report.nodeid.split("::")[0]
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            self.outcomes[path][report.outcome] += 1
        if report.when == "teardown" and path in self.pending:
            self.pending[path].discard(report.nodeid)
            if not self.pending[path]:
                self.files_done += 1
                counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.outcomes[path].items()))
                terminal = self.config.pluginmanager.get_plugin("terminalreporter")
                if terminal is not None:  # looked up now: it registers after conftest's configure
                    terminal.currentfspath = -2  # pytest's marker for "a line is open": ends the dots' line
                    terminal.ensure_newline()
                    terminal.write_line(f"{path}: {counts} ({self.files_done}/{len(self.pending)} files)")
