"""Fixtures of the hisparse-bench tests: the one check every command-line refusal test makes."""

from __future__ import annotations

import pytest

from hisparse_jax.bench import cli


@pytest.fixture
def one_line_error(capsys):
    """check(argv, status=2): runs the CLI with a bad argv and asserts exit `status`, nothing on
    stdout and one error line on stderr, which it returns."""

    def check(argv: list[str], status: int = 2) -> str:
        assert cli.main(argv) == status
        out, err = capsys.readouterr()
        assert out == ""
        assert err.startswith("hisparse-bench: error: ") and err.endswith("\n") and err.count("\n") == 1, err
        assert "Traceback" not in err
        return err

    return check
