"""A descriptor strace prints without its path (``-yy`` gives none when the path is longer
than PATH_MAX): the replay places it by what its own table says it opened, or refuses the
change; never resolves the call against the working directory instead (round 15)."""

from __future__ import annotations

import os
from pathlib import Path

from atomic_ckpt.testing.audit._strace import Call
from atomic_ckpt.testing.audit._trace import TraceRecorder

_DIR = os.O_RDONLY | os.O_DIRECTORY


def _calls(root: Path) -> list[Call]:
    """mkdir deep/, open it (strace could not print its path), make a file in it by the
    undecorated descriptor, rename it there."""
    return [
        Call(1, "mkdirat", [f"-100<{root}>", '"deep"', "0777"], 0, line=1),
        Call(1, "openat", [f"-100<{root}>", '"deep"', str(_DIR)], 4, line=2),
        Call(1, "mkdirat", ["4", '"sub"', "0777"], 0, line=3),
        Call(1, "openat", ["4", '"sub/w.tmp"', str(os.O_WRONLY | os.O_CREAT)], 5, line=4),
        Call(1, "write", ["5", '"abc"', "3"], 3, data=bytearray(b"abc"), line=5),
        Call(1, "renameat", ["4", '"sub/w.tmp"', "4", '"sub/w.bin"'], 0, line=6),
    ]


def test_an_undecorated_directory_descriptor_is_placed_by_the_table(tmp_path: Path) -> None:
    """*at calls by a descriptor strace printed bare land where the table says it points."""
    root = tmp_path / "ckpts"
    root.mkdir()
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    rec = TraceRecorder(root)
    rec._start_cwd = os.fspath(cwd)  # the old replay resolved bare descriptors against it
    rec.feed(_calls(root))
    assert rec.refusals == []
    said = [op.description for op in rec.ops]
    assert any("deep/sub/w.tmp" in d for d in said), said
    assert any("deep/sub/w.bin" in d for d in said), said


def test_a_directory_renamed_after_it_was_opened_is_placed_by_its_new_name(
    tmp_path: Path,
) -> None:
    """The table follows the directory's inode, not the name it was opened by."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed(
        [
            *_calls(root)[:3],
            Call(1, "rename", [f'"{root}/deep"', f'"{root}/moved"'], 0, line=4),
            Call(1, "mkdirat", ["4", '"again"', "0777"], 0, line=5),
        ]
    )
    assert rec.refusals == []
    assert "mkdirat moved/again" in [op.description for op in rec.ops]


def test_a_change_by_a_descriptor_the_replay_cannot_place_is_refused(tmp_path: Path) -> None:
    """A bare descriptor the table never saw opened: its change is refused, not dropped."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed([Call(1, "unlinkat", ["7", '"w.bin"', "0"], 0, line=1)])
    assert len(rec.refusals) == 1, rec.refusals
    assert "descriptor 7" in rec.refusals[0][1]


def test_fchdir_by_an_undecorated_descriptor_moves_the_working_directory(
    tmp_path: Path,
) -> None:
    """fchdir to a bare descriptor the table knows: relative paths follow it."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed(
        [
            *_calls(root)[:2],
            Call(1, "fchdir", ["4"], 0, line=3),
            Call(1, "mkdir", ['"here"', "0777"], 0, line=4),
        ]
    )
    assert rec.refusals == []
    assert "mkdir deep/here" in [op.description for op in rec.ops]


def test_fchdir_by_a_descriptor_the_replay_cannot_place_refuses_later_changes(
    tmp_path: Path,
) -> None:
    """After fchdir to an unknown bare descriptor, a relative change is refused."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed(
        [
            Call(1, "fchdir", ["9"], 0, line=1),
            Call(1, "mkdir", ['"here"', "0777"], 0, line=2),
        ]
    )
    assert len(rec.refusals) == 1, rec.refusals
