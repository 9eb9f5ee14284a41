"""A copy into the tree from a file outside it takes that file's bytes as they are after
the run; a file mapped shared through a descriptor open for writing may have changed
since with no system call to see, so such a copy is refused, whichever came first (round
15: a reused, memory-mapped staging file was called clean)."""

from __future__ import annotations

import os
from pathlib import Path

from atomic_ckpt.testing.audit._strace import Call
from atomic_ckpt.testing.audit._trace import TraceRecorder


def _calls(tmp_path: Path, access: int, *, map_first: bool) -> list[Call]:
    root, stage = tmp_path / "ckpts", tmp_path / "stage.bin"
    s = f"3<{stage}>"
    opened = [
        Call(1, "openat", [f"-100<{tmp_path}>", f'"{stage}"', str(access)], 3,
             ret_path=str(stage), line=1),
        Call(1, "openat", [f"-100<{tmp_path}>", f'"{root}/w.bin"',
                           str(os.O_WRONLY | os.O_CREAT)], 4, ret_path=f"{root}/w.bin", line=2),
    ]  # fmt: skip
    mapped = Call(1, "mmap", ["NULL", "4096", "0x3", "0x1", s, "0"], 0x7F0000000000, line=3)
    copied = Call(1, "sendfile", [f"4<{root}/w.bin>", s, "NULL", "4"], 4, line=4)
    return [*opened, *([mapped, copied] if map_first else [copied, mapped])]


def _refusals(tmp_path: Path, access: int, *, map_first: bool) -> list[str]:
    root = tmp_path / "ckpts"
    root.mkdir(exist_ok=True)
    (tmp_path / "stage.bin").write_bytes(b"good")
    rec = TraceRecorder(root)
    rec.feed(_calls(tmp_path, access, map_first=map_first))
    return [why for _, why in rec.refusals]


def test_a_copy_from_a_file_mapped_writable_before_it_is_refused(tmp_path: Path) -> None:
    """Mapped shared through an O_RDWR descriptor, then copied in: refused at the copy."""
    said = _refusals(tmp_path, os.O_RDWR, map_first=True)
    assert len(said) == 1, said
    assert "mapped shared through a descriptor open for writing" in said[0]


def test_a_file_mapped_writable_after_a_copy_from_it_is_refused(tmp_path: Path) -> None:
    """Copied in, then mapped shared through an O_RDWR descriptor: refused at the mmap."""
    said = _refusals(tmp_path, os.O_RDWR, map_first=False)
    assert len(said) == 1, said
    assert "after a copy from it" in said[0]


def test_a_copy_from_a_file_mapped_read_only_is_modelled(tmp_path: Path) -> None:
    """A shared mapping through an O_RDONLY descriptor cannot store: nothing refused."""
    assert _refusals(tmp_path, os.O_RDONLY, map_first=True) == []
    assert _refusals(tmp_path, os.O_RDONLY, map_first=False) == []
