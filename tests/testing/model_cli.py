"""The command line as actions of the model check (``promote``, ``rm``, ``prune``,
``clean``, ``mark-complete``), each the transition of its library call (a refusal is a
non-zero exit). They live with the tests, not in atomic_ckpt.testing, which may not
import the CLI (the layers import downward only): an example of adding actions of
your own to the alphabet."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli.main import main
from atomic_ckpt.testing.actions import Action
from atomic_ckpt.testing.alphabet import by_name
from atomic_ckpt.testing.model import Refused, RootModel


class CLIFailed(RuntimeError):
    """The command line exited non-zero (its refusals, whatever the library raised)."""


def _cli(*argv: str | Callable[[CheckpointDir], str]) -> Callable[[CheckpointDir], None]:
    """Run ``atomic-ckpt ARGV...`` in this process (so the recorder sees it); an argument
    may be a function of the root (its path, a step's directory name)."""

    def run(c: CheckpointDir) -> None:
        args = [a(c) if callable(a) else a for a in argv]
        if c.prefix:
            args += ["--prefix", c.prefix]
        rc = main(args)
        if rc != 0:
            raise CLIFailed(f"atomic-ckpt {' '.join(args)} exited {rc}")

    return run


def _as_cli(apply: Callable[[RootModel], None]) -> Callable[[RootModel], None]:
    def wrapped(m: RootModel) -> None:
        try:
            apply(m)
        except Refused as r:
            raise Refused(CLIFailed, r.why) from None

    return wrapped


def _like(name: str, api: str, run: Callable[[CheckpointDir], None]) -> Action:
    """The CLI command ``run`` as an action with the transition of the API action ``api``."""
    return dataclasses.replace(by_name(api), name=name, run=run, apply=_as_cli(by_name(api).apply))


def _root(c: CheckpointDir) -> str:
    return str(c.root)


CLI_ACTIONS: tuple[Action, ...] = (
    _like("cli_promote", "promote_named", _cli("promote", _root, "interrupted", "1")),
    # rm names the step as a user types it, a bare number, in a prefixed root too (issue
    # 30 item 12).
    _like("cli_rm", "delete_step", _cli("rm", _root, "1")),
    _like("cli_prune", "prune", _cli("prune", _root, "--keep-last", "1")),
    _like("cli_clean", "clean", _cli("clean", _root)),
    _like(
        "cli_mark_complete",
        "mark_complete_unchecked",
        _cli("mark-complete", lambda c: str(c.path_of(7)), "--no-check"),
    ),
)
