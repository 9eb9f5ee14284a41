"""A ``begin_named`` handle ends the way the guide's ``begin`` pattern ends one."""

from __future__ import annotations

from pathlib import Path

from atomic_ckpt import CheckpointDir, CommitStateError


def test_publish_of_a_named_handle_commits_or_names_finish(tmp_path: Path) -> None:
    """``begin_named(...).publish()`` commits the name, or its refusal names ``finish()``."""
    ckpts = CheckpointDir(tmp_path / "ckpts")
    handle = ckpts.begin_named("interrupted")
    try:
        (handle.path / "model.pt").write_bytes(b"m")
        error: CommitStateError | None = None
        try:
            handle.publish()
        except CommitStateError as exc:
            error = exc
        if error is None:
            assert ckpts.dir_of("interrupted") == tmp_path / "ckpts" / "interrupted"
        else:
            assert "finish()" in str(error)
    finally:
        handle.abort()
