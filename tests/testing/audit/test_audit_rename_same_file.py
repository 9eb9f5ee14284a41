"""rename(2) between two hard links of one file does nothing: both names stay; and a
successful removal of a name the replay lacks is refused (round 15: the replay dropped the
old name, so the states between the rename and a later unlink of that name lacked it, and
that unlink was then silently ignored)."""

from __future__ import annotations

import os
from pathlib import Path

from atomic_ckpt.testing.audit._strace import Call
from atomic_ckpt.testing.audit._trace import TraceRecorder


def test_a_rename_between_two_links_of_one_file_keeps_both(tmp_path: Path) -> None:
    """link w.bin backup.bin; rename backup.bin w.bin: both names are still there, and
    the later unlink of backup.bin is an operation of its own."""
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "w.bin").write_bytes(b"w")
    rec = TraceRecorder(root)
    rec.feed(
        [
            Call(1, "link", [f'"{root}/w.bin"', f'"{root}/backup.bin"'], 0, line=1),
            Call(1, "rename", [f'"{root}/backup.bin"', f'"{root}/w.bin"'], 0, line=2),
            Call(1, "unlink", [f'"{root}/backup.bin"'], 0, line=3),
        ]
    )
    assert rec.refusals == []
    said = [op.description for op in rec.ops]
    assert len(said) == 2, said
    assert said[1] == "unlink backup.bin", said
    assert sorted(os.listdir(root)) == ["w.bin"]  # the replay never touches the disk


def test_removing_a_name_the_replay_never_saw_made_is_refused(tmp_path: Path) -> None:
    """A successful unlink of a name the replay's tree lacks means the replay went astray
    (that name was there): refused, never silently ignored."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed([Call(1, "unlink", [f'"{root}/ghost.bin"'], 0, line=1)])
    assert [p for p, _ in rec.refusals] == ["ghost.bin"]
    assert "never saw it made" in rec.refusals[0][1]
