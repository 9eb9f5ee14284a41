"""A child forked inside a block of the library never ends the parent's write (issue 21,
item 11 and its look-alikes): it gets CommitStateError on a normal exit, and neither a
normal exit nor an exception there touches the parent's temporary file or target."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

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


# ================================================================ links swapped in (item 2's kin)


def test_remove_tree_never_follows_a_directory_swapped_for_a_link_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subdirectory replaced by a symlink to elsewhere between the listing of its parent
    and the descent into it: remove_tree removes the link, never the files it points to."""
    from treeutil import write

    from atomic_ckpt._core.l2_syscalls import fs as _fs

    victim = tmp_path / "old-copy"
    write(victim, {"model.bin": b"m", "shards/a.bin": b"a"})
    elsewhere = tmp_path / "elsewhere"
    write(elsewhere, {"a.bin": b"precious"})
    real_scandir = os.scandir
    swapped: list[bool] = []

    class SwapAfterListing:
        """The top directory's listing; once it is read, shards/ becomes a link."""

        def __init__(self, it: Any) -> None:
            self._it = it

        def __enter__(self) -> Any:
            self._it.__enter__()
            return self

        def __exit__(self, *exc: object) -> None:
            self._it.__exit__(*exc)
            if not swapped:
                os.rename(victim / "shards", tmp_path / "shards-moved")
                os.symlink(elsewhere, victim / "shards")
                swapped.append(True)

        def __iter__(self) -> Any:
            return iter(self._it)

    def scandir(path: Any = ".") -> Any:
        it = real_scandir(path)
        return SwapAfterListing(it) if not swapped else it

    monkeypatch.setattr(os, "scandir", scandir)
    with contextlib.suppress(OSError):  # leaving something is not the failure here
        _fs.remove_tree(victim)
    monkeypatch.undo()
    assert swapped == [True]  # the race was staged
    assert (elsewhere / "a.bin").read_bytes() == b"precious"
    assert not (victim / "shards").is_symlink() or os.readlink(victim / "shards") == str(elsewhere)
