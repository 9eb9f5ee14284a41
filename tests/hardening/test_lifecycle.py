"""A commit belongs to the process that began it, and survives the end of the interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from atomic_ckpt import MARKER, CheckpointDir

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs fork and POSIX exit")

SHARDS = 10
"""Enough files that the commit fsyncs them on its thread pool."""


def _run_script(source: str, root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(source), str(root), str(SHARDS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def _files(directory: Path) -> dict[str, bytes]:
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MARKER
    }


# ---------------------------------------------------------------- interpreter exit

_ASYNC_PENDING_AT_EXIT = """
    import sys
    import time
    from pathlib import Path

    from atomic_ckpt import AsyncCommitter, CheckpointDir

    saver = AsyncCommitter(CheckpointDir(sys.argv[1]))

    def write(directory: Path) -> None:
        time.sleep(0.3)  # still writing when the main thread reaches the end of the script
        for i in range(int(sys.argv[2])):
            (directory / f"shard{i}.bin").write_bytes(bytes([i]) * 4096)

    saver.save(7, write)
    # no wait() or close(): the script simply ends here
"""

_ASYNC_FAILING_AT_EXIT = """
    import sys
    import time
    from pathlib import Path

    from atomic_ckpt import AsyncCommitter, CheckpointDir

    saver = AsyncCommitter(CheckpointDir(sys.argv[1]))

    def write(directory: Path) -> None:
        time.sleep(0.3)
        raise OSError(28, "No space left on device (injected)")

    saver.save(7, write)
    # no wait() or close(): nothing will ever raise the background error
"""

_COMMIT_IN_ATEXIT = """
    import atexit
    import sys

    from atomic_ckpt import CheckpointDir

    def final_save() -> None:
        with CheckpointDir(sys.argv[1]).commit(7) as directory:
            for i in range(int(sys.argv[2])):
                (directory / f"shard{i}.bin").write_bytes(bytes([i]) * 4096)

    atexit.register(final_save)
"""


def test_async_commit_pending_at_exit_completes_or_fails_the_exit_status(tmp_path: Path) -> None:
    """A script that ends with an AsyncCommitter save in flight commits it, or exits non-zero."""
    root = tmp_path / "ckpts"
    proc = _run_script(_ASYNC_PENDING_AT_EXIT, root)
    steps = CheckpointDir(root).steps()
    assert steps == [7] or proc.returncode != 0, (
        f"the pending commit was lost and the script exited {proc.returncode}: {proc.stderr}"
    )
    if steps == [7]:
        ckpt = CheckpointDir(root).verify(7)
        assert len(_files(ckpt.path)) == SHARDS


def test_an_unobserved_background_failure_makes_the_exit_status_non_zero(
    tmp_path: Path,
) -> None:
    """A script whose pending async commit fails, with nothing left to raise it, exits 1 and
    says which step was lost (not 0, which a job script would read as success)."""
    root = tmp_path / "ckpts"
    proc = _run_script(_ASYNC_FAILING_AT_EXIT, root)
    assert "(injected)" in proc.stderr  # the injected failure was hit
    assert proc.returncode == 1, proc.stderr
    assert "background commit of step 7 failed" in proc.stderr
    assert CheckpointDir(root).steps() == []


def test_commit_from_an_atexit_handler_works(tmp_path: Path) -> None:
    """A plain commit() run by an atexit handler commits its checkpoint; the exit status is 0."""
    root = tmp_path / "ckpts"
    proc = _run_script(_COMMIT_IN_ATEXIT, root)
    assert CheckpointDir(root).steps() == [7], proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert len(_files(CheckpointDir(root).verify(7).path)) == SHARDS


# ---------------------------------------------------------------- fork inside a commit block


def _leave_block(how: str) -> None:
    """In the forked child: leave the commit block the way ``how`` says."""
    if how == "sys.exit":
        sys.exit(0)
    if how == "exception":
        raise RuntimeError("the child fails")
    # "normally": fall off the end of the block


@pytest.mark.parametrize("how", ["normally", "sys.exit", "exception"])
def test_a_child_forked_inside_a_commit_neither_publishes_nor_discards_it(
    ckpts: CheckpointDir, how: str
) -> None:
    """A child forked inside commit() that leaves the block has no say over the parent's commit."""
    parent = os.getpid()
    try:
        with ckpts.commit(1) as path:
            (path / "first.bin").write_bytes(b"written before the fork")
            pid = os.fork()
            if pid == 0:
                _leave_block(how)
            else:
                os.waitpid(pid, 0)
                assert ckpts.steps() == [], (
                    f"the child leaving {how} published the parent's half-written save"
                )
                assert path.is_dir(), f"the child leaving {how} deleted the parent's staging dir"
                (path / "second.bin").write_bytes(b"written after the child left")
    finally:
        if os.getpid() != parent:
            os._exit(0)  # the child never returns into pytest
    assert ckpts.steps() == [1]
    assert _files(ckpts.verify(1).path) == {
        "first.bin": b"written before the fork",
        "second.bin": b"written after the child left",
    }
