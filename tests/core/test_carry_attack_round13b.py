"""Round 13b attack on issue 32 (carry): each test specifies behaviour that failed.

A carry trusts a committed file without hashing it when its inode, size and mtime are the
ones its manifest recorded. On a coarse clock (a filesystem or kernel whose timestamps
tick in whole seconds, or jiffies) a same-size write just after the file was hashed at its
commit, in the same tick, keeps the mtime: git's "racily clean" case. A file whose
recorded mtime is not well before its checkpoint's marker is hashed before it is carried.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, VerificationError
from atomic_ckpt._core.l1_names.names import MARKER

MODEL = bytes(range(256)) * 64


def test_a_racily_clean_source_is_hashed_before_it_is_carried(tmp_path: Path) -> None:
    """The file's recorded mtime equals its marker's (one tick of a coarse clock), then
    its bytes are rewritten in place, same size, and its mtime is what the clock would
    have kept: the carry hashes it and refuses it, instead of carrying changed bytes
    under the old checksum (a new checkpoint that fails verify())."""
    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(MODEL)
    src = tmp_path / "r" / "1" / "model.pt"
    st = os.stat(src)
    marker = tmp_path / "r" / "1" / MARKER
    os.utime(marker, ns=(st.st_atime_ns, st.st_mtime_ns))  # same tick as the file
    with open(src, "r+b") as f:
        f.write(b"X" * 16)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # the coarse clock kept it
    assert os.stat(src).st_ino == st.st_ino
    with pytest.raises(VerificationError), ckpts.begin(2) as commit:
        commit.carry("model.pt", from_=1)
    assert [c.step for c in ckpts.checkpoints()] == [1]


def test_an_old_source_is_still_carried_unhashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file written well before its marker (by more than the timestamp granularity) is
    still trusted on its identity: not read again."""
    from atomic_ckpt._core.l4_protocol import carry as _carry

    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(MODEL)
        old = os.stat(path / "model.pt").st_mtime_ns - 60 * 10**9
        os.utime(path / "model.pt", ns=(old, old))
    hashed: list[object] = []
    real = _carry.checksum_file
    monkeypatch.setattr(_carry, "checksum_file", lambda *a: hashed.append(a) or real(*a))
    with ckpts.begin(2) as commit:
        commit.carry("model.pt", from_=1)
    assert hashed == []
    assert ckpts.verify(2).step == 2


def test_a_copied_carrier_is_carried_again_unhashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A carry made by copy (or reflink) keeps its source's mtime, so carrying it on from
    the next checkpoint is not a racily clean file to hash every time."""
    import errno

    from atomic_ckpt._core.l2_syscalls import share as _share
    from atomic_ckpt._core.l4_protocol import carry as _carry

    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(MODEL)
        old = os.stat(path / "model.pt").st_mtime_ns - 60 * 10**9
        os.utime(path / "model.pt", ns=(old, old))

    def no_link(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EMLINK, "Too many links")

    monkeypatch.setattr(_share, "_reflink", lambda fd_in, dst: False)
    monkeypatch.setattr(_share.os, "link", no_link)
    with ckpts.begin(2) as commit:
        assert commit.carry("model.pt", from_=1) == "copy"
    hashed: list[object] = []
    real = _carry.checksum_file
    monkeypatch.setattr(_carry, "checksum_file", lambda *a: hashed.append(a) or real(*a))
    with ckpts.begin(3) as commit:
        commit.carry("model.pt", from_=2)
    assert hashed == []
    monkeypatch.undo()
    assert ckpts.verify(3).step == 3


@pytest.mark.parametrize("files", [False, True], ids=["metadata-only", "with-a-file"])
def test_an_amend_does_not_make_a_racily_clean_file_look_old(tmp_path: Path, files: bool) -> None:
    """A file written in the tick of its commit, then changed in place in that tick (same
    size, same mtime), is racily clean; an amend a minute later writes a new marker, whose
    mtime is well after the file's: the file must still be hashed to be carried (git
    smudges such entries when it writes its index anew)."""
    ckpts = CheckpointDir(tmp_path / "r")
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(MODEL)
    src = tmp_path / "r" / "1" / "model.pt"
    st = os.stat(src)
    marker = tmp_path / "r" / "1" / MARKER
    os.utime(marker, ns=(st.st_atime_ns, st.st_mtime_ns))  # same tick as the file
    with open(src, "r+b") as f:
        f.write(b"X" * 16)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))  # the coarse clock kept it
    later = st.st_mtime_ns + 60 * 10**9
    with ckpts.amend(1, metadata={"note": "later"}) as path:
        if files:
            (path / "extra.txt").write_bytes(b"x")
    os.utime(tmp_path / "r" / "1" / MARKER, ns=(later, later))  # written a minute later
    assert os.stat(tmp_path / "r" / "1" / "model.pt").st_mtime_ns == st.st_mtime_ns
    with pytest.raises(VerificationError), ckpts.begin(2) as commit:
        commit.carry("model.pt", from_=1)
    assert [c.step for c in ckpts.checkpoints()] == [1]


def test_a_just_written_file_of_a_root_without_checksums_is_carried(tmp_path: Path) -> None:
    """Without checksums nothing can be hashed, and nothing is claimed about the bytes: a
    file written just before its commit (racily clean) is carried on its identity, as
    before, not refused as "changed after its commit"."""
    ckpts = CheckpointDir(tmp_path / "r", checksum=None)
    with ckpts.commit(1) as path:
        (path / "model.pt").write_bytes(MODEL)
    with ckpts.commit(2, carry={"model.pt": 1}):
        pass
    assert ckpts.verify(2).step == 2
    with ckpts.amend(1, metadata={"note": "amended"}):  # nothing smudged either
        pass
    with ckpts.commit(3, carry={"model.pt": 1}):
        pass
    assert ckpts.verify(3).step == 3
