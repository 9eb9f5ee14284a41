"""The CLI guide (docs/guides/cli.md) names every command and option the parser has."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

import pytest

# The module, not the function that atomic_ckpt.cli re-exports under the same name.
cli_main = importlib.import_module("atomic_ckpt.cli.main")

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "cli.md"


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = cli_main._parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def _options(command: argparse.ArgumentParser) -> list[str]:
    return [
        opt
        for action in command._actions
        for opt in action.option_strings
        if opt not in ("-h", "--help")
    ]


SHARED = "## Options every root command takes"
"""The guide's section for the options every ROOT command shares."""


def _section(heading: str) -> str:
    """The guide's text from ``heading`` to the next heading of any level."""
    text = GUIDE.read_text()
    start = text.index(heading)
    rest = text[start + len(heading) :]
    ends = [i for i in (rest.find("\n## "), rest.find("\n### ")) if i >= 0]
    return rest[: min(ends)] if ends else rest


@pytest.mark.parametrize("name", sorted(_commands()))
def test_every_command_has_a_section(name: str) -> None:
    """Each subcommand has a ``### `name ...``` section in the guide."""
    assert f"### `{name}" in GUIDE.read_text(), f"docs/guides/cli.md has no section for {name}"


@pytest.mark.parametrize(
    ("name", "option"),
    sorted((name, opt) for name, cmd in _commands().items() for opt in _options(cmd)),
)
def test_every_option_is_documented(name: str, option: str) -> None:
    """Each option of each subcommand is in its section (or in the shared options')."""
    text = GUIDE.read_text()
    heading = next(line for line in text.splitlines() if line.startswith(f"### `{name}"))
    where = _section(heading) + _section(SHARED)
    assert f"`{option}" in where, f"{name} {option} is not in its section of cli.md"


def test_the_guide_lists_the_exit_statuses() -> None:
    """The exit statuses the CLI returns are the ones the guide's table lists."""
    from atomic_ckpt.cli import common

    text = GUIDE.read_text()
    for status in (common.EXIT_OK, common.EXIT_NONE, common.EXIT_ERROR, 130):
        assert f"| {status} |" in text
