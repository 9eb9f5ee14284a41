"""A block joined from another thread that is still writing when the commit it joined is
aborted (its own block raised: Ctrl-C, an error): the joined block's next write fails on
the removed staging directory, and that surfaces as CommitStateError saying the commit was
aborted, chained from the write's error (it was a raw FileNotFoundError naming the internal
staging directory, as issue 30 item 10 found inside amend). Nothing is published."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from atomic_ckpt import TMP_INFIX, CheckpointDir, CommitStateError


@pytest.mark.parametrize("outer_error", [KeyboardInterrupt, OSError])
def test_a_joined_block_outliving_its_aborted_commit_gets_commit_state_error(
    tmp_path: Path, outer_error: type[BaseException]
) -> None:
    """The joiner opened its block, then the outer block raised; the joiner's write into the
    removed staging dir ends its block with CommitStateError (from FileNotFoundError)."""
    root = tmp_path / "ckpts"
    c = CheckpointDir(root)
    joined, aborted = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def joiner() -> None:
        try:
            with c.commit(5, join=True) as path:
                joined.set()
                assert aborted.wait(60)
                (path / "late.bin").write_bytes(b"late")
        except BaseException as exc:  # checked below
            errors.append(exc)

    thread = threading.Thread(target=joiner)
    with pytest.raises(outer_error), c.commit(5):  # noqa: PT012
        thread.start()
        assert joined.wait(60)
        raise outer_error("the trainer's own block failed")
    aborted.set()
    thread.join(60)
    assert len(errors) == 1
    assert isinstance(errors[0], CommitStateError), repr(errors[0])
    assert "aborted" in str(errors[0])
    assert isinstance(errors[0].__cause__, FileNotFoundError)
    assert c.steps() == []
    assert [p.name for p in root.iterdir() if TMP_INFIX in p.name] == []
