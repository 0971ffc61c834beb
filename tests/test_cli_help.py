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
