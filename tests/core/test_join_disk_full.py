"""A full disk inside a joined block whose error the caller swallows (issue 30): the commit
it joined is aborted (nothing published, nothing left behind, older checkpoints intact),
and the error the caller gets at the end says the disk is full and what to do, on every
joining path, single-process and from another thread. The joined block's own error is a
DiskFullError too, as a full disk in an ordinary commit's block is."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from test_join_attack_fixes import _enospc, _fill, _leftovers, tiny_fs  # noqa: F401
from treeutil import contents, write

from atomic_ckpt import CheckpointDir, CommitStateError, DiskFullError
from atomic_ckpt.distributed import rank0_commit

Opener = Callable[[CheckpointDir, int], AbstractContextManager[Path | None]]

OUTERS: dict[str, Opener] = {
    "commit": lambda c, s: c.commit(s),
    "rank0_commit": rank0_commit,
}
JOINERS: dict[str, Opener] = {
    "commit": lambda c, s: c.commit(s, join=True),
    "rank0_commit": lambda c, s: rank0_commit(c, s, join=True),
}
PAIRS = pytest.mark.parametrize(
    ("outer", "joiner"),
    [(OUTERS[o], JOINERS[j]) for o in OUTERS for j in JOINERS],
    ids=[f"{j}-in-{o}" for o in OUTERS for j in JOINERS],
)


def _check(caught: pytest.ExceptionInfo[BaseException], ckpts: CheckpointDir) -> None:
    """Aborted, nothing published or left over, step 1 intact; the error says disk full."""
    error = caught.value
    assert isinstance(error, CommitStateError)
    assert "is full" in str(error)
    assert "free space" in str(error).lower()
    assert "Nothing was published" in str(error)
    assert isinstance(error.__cause__, OSError)
    assert error.__cause__.errno == errno.ENOSPC
    assert ckpts.steps() == [1]
    assert ckpts.staging(2) is None
    assert _leftovers(ckpts.root) == []
    assert contents(ckpts.verify(1).path) == {"old.bin": b"old"}


def _with_step_1(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        write(path, {"old.bin": b"old"})


@PAIRS
def test_a_swallowed_full_disk_in_a_joined_block_aborts_and_says_so(
    ckpts: CheckpointDir, outer: Opener, joiner: Opener
) -> None:
    """ENOSPC injected into the joined block's write, swallowed by the caller: the outer
    block ends with CommitStateError saying the disk is full and to free space."""
    _with_step_1(ckpts)
    hit: list[BaseException] = []

    def trainer_save() -> None:
        with outer(ckpts, 2) as path:
            assert path is not None
            write(path, {"a.bin": b"a"})
            try:
                with joiner(ckpts, 2) as inner:
                    assert inner is not None
                    write(inner, {"half.bin": b"hal"})
                    raise _enospc(inner / "half.bin")
            except OSError as exc:
                hit.append(exc)  # buggy glue carries on

    with pytest.raises(CommitStateError) as caught:
        trainer_save()
    assert len(hit) == 1, "the injected ENOSPC fired once, in the joined block"
    assert isinstance(hit[0], DiskFullError)
    assert "is full" in str(hit[0])
    _check(caught, ckpts)


def test_a_swallowed_full_disk_in_a_block_joined_from_another_thread(
    ckpts: CheckpointDir,
) -> None:
    """The same from a shard-writer thread: the outer publish waits for it, then refuses."""
    _with_step_1(ckpts)
    hit: list[BaseException] = []

    def shard_writer() -> None:
        try:
            with ckpts.commit(2, join=True) as inner:
                raise _enospc(inner / "shard.bin")
        except OSError as exc:
            hit.append(exc)

    def trainer_save() -> None:
        with ckpts.commit(2) as path:
            write(path, {"a.bin": b"a"})
            worker = threading.Thread(target=shard_writer)
            worker.start()
            worker.join()

    with pytest.raises(CommitStateError) as caught:
        trainer_save()
    assert len(hit) == 1, "the injected ENOSPC fired once, in the joined block"
    _check(caught, ckpts)


def test_a_real_full_disk_in_a_swallowed_joined_block(tiny_fs: Path) -> None:  # noqa: F811
    """On a real 1 MiB filesystem: the joined block's write fills it (a real ENOSPC), the
    caller swallows it; the commit is aborted and its error says the disk is full."""
    ckpts = CheckpointDir(tiny_fs / "root")
    _with_step_1(ckpts)
    hit: list[OSError] = []

    def trainer_save() -> None:
        with ckpts.commit(2) as path:
            write(path, {"a.bin": b"a"})
            try:
                with ckpts.commit(2, join=True) as inner:
                    _fill(inner / "big.bin")
            except OSError as exc:
                hit.append(exc)

    with pytest.raises(CommitStateError) as caught:
        trainer_save()
    assert len(hit) == 1, "the disk really filled up inside the joined block"
    assert hit[0].errno == errno.ENOSPC
    _check(caught, ckpts)
