"""Fixes for the attacker's repros of issue 32 (attack/): each test fails before its fix."""

from __future__ import annotations

import os
from pathlib import Path

from atomic_ckpt import CheckpointDir


def _restore_mtime_after_flip(f: Path) -> None:
    st = os.stat(f)
    with open(f, "r+b") as h:
        h.write(b"B")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a2_dedup_never_links_a_source_changed_with_its_mtime_restored(tmp_path: Path) -> None:
    c = CheckpointDir(tmp_path / "r")
    good = b"A" * 4096
    with c.commit(1) as p:
        (p / "w.bin").write_bytes(good)
    _restore_mtime_after_flip(c.path_of(1) / "w.bin")
    with c.begin(2, dedup=True) as cm:
        (cm.path / "w.bin").write_bytes(good)
    assert cm.deduped == {}
    assert (c.path_of(2) / "w.bin").read_bytes() == good
    c.verify(2)


def test_a2_dedup_still_links_equal_bytes(tmp_path: Path) -> None:
    c = CheckpointDir(tmp_path / "r")
    good = b"A" * 4096
    with c.commit(1) as p:
        (p / "w.bin").write_bytes(good)
    with c.begin(2, dedup=True) as cm:
        (cm.path / "w.bin").write_bytes(good)
    assert set(cm.deduped) == {"w.bin"}
    c.verify(2)
