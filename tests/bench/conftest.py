"""The one check every command-line refusal test makes: exit status, nothing on stdout, one line."""

from __future__ import annotations

from hisparse_jax.bench import cli


def one_line_error(capsys, argv: list[str], status: int = 2) -> str:
    """Runs the CLI with a bad argv: exit `status`, nothing on stdout, one error line on stderr."""
    assert cli.main(argv) == status
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("hisparse-bench: error: ") and err.endswith("\n") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err
