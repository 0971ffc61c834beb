"""Every option of every command says what it does in --help."""

from __future__ import annotations

import argparse

from hisparse_jax.bench import cli
from hisparse_jax.train import __main__ as train_cli


def _silent_options(parser: argparse.ArgumentParser, name: str) -> list[str]:
    out = []
    for action in parser._actions:
        subcommands = action.choices if isinstance(action.choices, dict) else {}
        if subcommands and all(isinstance(p, argparse.ArgumentParser) for p in subcommands.values()):
            for sub, subparser in subcommands.items():
                out += _silent_options(subparser, f"{name} {sub}")
        elif action.dest != "help" and not action.help:
            out.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    return out


def test_every_option_has_help_text():
    assert _silent_options(cli.parser(), "hisparse-bench") + _silent_options(
        train_cli.parser(), "python -m hisparse_jax.train") == []


def test_modes_take_full_kv_and_the_library_name(capsys):
    parse = cli.parser().parse_args
    assert parse(["decode", "--modes", "full-kv", "hisparse"]).modes == ["device", "hisparse"]
    assert parse(["decode", "--modes", "device"]).modes == ["device"]


def _script_parsers() -> dict[str, argparse.ArgumentParser]:
    """The argument parser of every script under benchmarks/ that builds one in main(): main runs
    until it parses, where the parser is kept and the run stopped (nothing is measured)."""
    import importlib.util
    from pathlib import Path

    class Parsed(Exception):
        pass

    found = {}
    original = argparse.ArgumentParser.parse_args

    def keep(self, *args, **kwargs):
        found[current] = self
        raise Parsed

    for script in sorted((Path(__file__).parents[1] / "benchmarks").glob("*.py")):
        if "argparse" not in script.read_text():
            continue
        current = script.name
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        argparse.ArgumentParser.parse_args = keep
        try:
            module.main()
        except Parsed:
            pass
        finally:
            argparse.ArgumentParser.parse_args = original
    return found


def test_every_benchmark_script_option_has_help_text():
    parsers = _script_parsers()
    assert len(parsers) >= 5, sorted(parsers)
    silent = [s for name, p in parsers.items() for s in _silent_options(p, name)]
    assert silent == []
