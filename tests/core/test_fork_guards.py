"""A child forked inside a block of the library never ends the parent's write (issue 21,
item 11 and its look-alikes): it gets CommitStateError on a normal exit, and neither a
normal exit nor an exception there touches the parent's temporary file or target."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import CommitStateError, atomic_write


def _child_outcome(pid: int, written: int, outcome: bytes) -> None:
    """In the child: report ``outcome`` to the parent and exit at once."""
    if pid == 0:  # pragma: no cover - the child
        os.write(written, outcome)
        os._exit(0)


@pytest.mark.parametrize("child_raises", [False, True], ids=["child-exits-normally", "raises"])
def test_a_child_forked_inside_atomic_write_never_touches_the_parents_file(
    tmp_path: Path, child_raises: bool
) -> None:
    """The parent is mid-write when it forks: the child leaving the block (normally, or by
    an exception) neither renames the half-written file over the target nor removes it;
    the parent then finishes, and the target holds the parent's whole file."""
    target = tmp_path / "last.ckpt"
    target.write_bytes(b"old")
    read, written = os.pipe()
    pid = -1
    try:
        with atomic_write(target) as tmp:
            tmp.write_bytes(b"half")  # the parent is mid-write
            pid = os.fork()
            if pid == 0 and child_raises:  # pragma: no cover - the child
                raise KeyError("the child's own error")
            if pid != 0:
                os.close(written)
                os.waitpid(pid, 0)  # the child has left the block
                assert target.read_bytes() == b"old"
                assert tmp.read_bytes() == b"half"
                tmp.write_bytes(b"the parent's whole file")
    except CommitStateError as exc:
        _child_outcome(pid, written, b"refused" if "forked" in str(exc) else b"other")
        raise
    except KeyError:
        _child_outcome(pid, written, b"its own error")
        raise
    except BaseException:
        _child_outcome(pid, written, b"failed")
        raise
    _child_outcome(pid, written, b"renamed")
    assert os.read(read, 64) == (b"its own error" if child_raises else b"refused")
    os.close(read)
    assert target.read_bytes() == b"the parent's whole file"
    assert sorted(os.listdir(tmp_path)) == ["last.ckpt"]
