"""Shared Hypothesis strategies: checkpoint contents and whole workloads of commits.

A :class:`Workload` is a durable starting state (``setup``: checkpoints
committed earlier, legacy directories) and the actions under test (``save``:
commits of new or existing steps, adoptions, prunes), in the form
:func:`atomic_ckpt.testing.explore` takes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from hypothesis import strategies as st

from atomic_ckpt import MARKER, CheckpointDir

__all__ = [
    "Adopt",
    "Commit",
    "Contents",
    "Legacy",
    "Prune",
    "Workload",
    "contents",
    "examples",
    "workloads",
]

FILE_NAMES = ("model.safetensors", "optim.pt", "rng.json", "a")
DIR_NAMES = ("", "shards/", "shards/rank0/", "extra/")
EMPTY_DIRS = ("logs", "shards/empty")


def examples(default: int) -> int:
    """Hypothesis ``max_examples`` for the crash tests.

    ``CRASH_EXAMPLES=N`` sets it; ``ATOMIC_CKPT_SOAK=1`` multiplies the
    default by 25 for a soak run.
    """
    if os.environ.get("CRASH_EXAMPLES"):
        return int(os.environ["CRASH_EXAMPLES"])
    if os.environ.get("ATOMIC_CKPT_SOAK", "") not in ("", "0"):
        return default * 25
    return default


@dataclass(frozen=True)
class Contents:
    """What one save writes inside its directory."""

    files: dict[str, bytes]
    empty_dirs: tuple[str, ...] = ()
    link: bool = False
    """Also a relative symlink ``latest.bin -> <first file>``."""

    def write(self, directory: Path) -> None:
        for rel in self.empty_dirs:
            (directory / rel).mkdir(parents=True, exist_ok=True)
        for rel, data in sorted(self.files.items()):
            path = directory / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if self.link and self.files:
            os.symlink(min(self.files), directory / "latest.bin")


@dataclass(frozen=True)
class Commit:
    step: int
    contents: Contents


@dataclass(frozen=True)
class Adopt:
    """A directory written without the library, then ``mark_complete``."""

    step: int
    contents: Contents


@dataclass(frozen=True)
class Prune:
    keep_last: int


@dataclass(frozen=True)
class Legacy:
    """A directory left by older training code: files and (maybe) an empty marker."""

    step: int
    contents: Contents
    marked: bool


Action = Commit | Adopt | Prune


@dataclass(frozen=True)
class Workload:
    """A durable starting state and a sequence of actions on one checkpoint root."""

    earlier: tuple[Commit, ...] = ()
    legacy: tuple[Legacy, ...] = ()
    actions: tuple[Action, ...] = ()
    prefix: str = ""
    checksum: str | None = "crc32"

    def setup(self, ckpts: CheckpointDir) -> None:
        """Commit the earlier checkpoints and write the legacy directories."""
        ckpts.root.mkdir(parents=True, exist_ok=True)
        for c in self.earlier:
            with ckpts.commit(c.step) as path:
                c.contents.write(path)
        for leg in self.legacy:
            path = ckpts.path_of(leg.step)
            if path.exists():
                continue
            path.mkdir()
            leg.contents.write(path)
            if leg.marked:
                (path / MARKER).write_bytes(b"")

    def save(self, ckpts: CheckpointDir) -> None:
        """Run the actions (the part the crash simulation records)."""
        for a in self.actions:
            if isinstance(a, Commit):
                with ckpts.commit(a.step) as path:
                    a.contents.write(path)
            elif isinstance(a, Adopt):
                path = ckpts.path_of(a.step)
                if not path.exists():
                    path.mkdir()
                    a.contents.write(path)
                # Random bytes under real formats' names: the protocol is under test here,
                # not the content checks (tests/core/test_adopt_checks.py has those).
                ckpts.mark_complete(a.step, check=False)
            else:
                ckpts.prune(keep_last=a.keep_last)


def contents(*, max_files: int = 3, max_size: int = 300) -> st.SearchStrategy[Contents]:
    """A save's files (some nested in subdirectories), maybe empty dirs and a symlink."""
    paths = st.builds(lambda d, n: d + n, st.sampled_from(DIR_NAMES), st.sampled_from(FILE_NAMES))
    data = st.one_of(
        st.binary(max_size=max_size),
        # Long runs of one byte: zero-filled and torn copies stay distinguishable.
        st.builds(lambda b, n: bytes([b]) * n, st.integers(1, 255), st.integers(1, max_size)),
    )
    return st.builds(
        Contents,
        files=st.dictionaries(paths, data, min_size=1, max_size=max_files),
        empty_dirs=st.lists(st.sampled_from(EMPTY_DIRS), max_size=1, unique=True).map(tuple),
        link=st.booleans(),
    )


def _commit(steps: st.SearchStrategy[int]) -> st.SearchStrategy[Commit]:
    return st.builds(Commit, steps, contents())


@st.composite
def workloads(
    draw: st.DrawFn,
    *,
    max_actions: int = 3,
    adopt: bool = True,
    prune: bool = True,
) -> Workload:
    """Commits of new steps and of existing ones (replacements), over earlier checkpoints,
    legacy directories to adopt, and prunes."""
    steps = st.integers(0, 3)
    action_kinds: list[st.SearchStrategy[Action]] = [_commit(steps)]
    if adopt:
        action_kinds.append(st.builds(Adopt, st.integers(10, 11), contents(max_files=2)))
    if prune:
        action_kinds.append(st.builds(Prune, st.integers(1, 2)))
    earlier = draw(st.lists(_commit(steps), max_size=2).map(tuple))
    legacy: tuple[Legacy, ...] = ()
    if adopt:
        legacy = draw(
            st.lists(
                st.builds(Legacy, st.integers(10, 11), contents(max_files=2), st.booleans()),
                max_size=1,
            ).map(tuple)
        )
    actions = draw(st.lists(st.one_of(action_kinds), min_size=1, max_size=max_actions).map(tuple))
    return Workload(
        earlier=earlier,
        legacy=legacy,
        actions=actions,
        prefix=draw(st.sampled_from(["", "checkpoint-"])),
        checksum=draw(st.sampled_from(["crc32", None, "sha256"])),
    )
