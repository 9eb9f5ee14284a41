"""``mark_complete`` refuses a directory holding the temporary of a one-file write that
never finished (``.model.pt.tmp-<hex>``, what atomic_ckpt's own atomic writes leave when
killed before the rename): the save it belongs to was cut short, so its final file is
missing or an older one. ``check_contents`` reports such a file as a problem too;
``check=False`` adopts the directory anyway, as for a damaged file."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomic_ckpt import MARKER, CheckpointDir, VerificationError

LEFTOVER = ".model.pt.tmp-0123456789abcdef0123456789abcdef"


def _legacy(tmp_path: Path) -> CheckpointDir:
    c = CheckpointDir(tmp_path / "ckpts")
    (tmp_path / "ckpts" / "5").mkdir(parents=True)
    (tmp_path / "ckpts" / "5" / "a.json").write_text("{}")
    (tmp_path / "ckpts" / "5" / LEFTOVER).write_bytes(b"half a model")
    return c


def test_mark_complete_refuses_a_directory_with_an_unfinished_write_s_temporary(
    tmp_path: Path,
) -> None:
    """The leftover was hashed into the manifest and the directory adopted (exit 0), a
    resume then loading a save whose model.pt was never renamed into place. It is a
    VerificationError naming the temporary, nothing is marked, and check_contents says
    what it is."""
    c = _legacy(tmp_path)
    [check] = [f for f in c.check_contents(5) if f.path == LEFTOVER]
    assert check.problem is not None
    assert "never finished" in check.problem
    with pytest.raises(VerificationError, match="never finished") as caught:
        c.mark_complete(5)
    assert LEFTOVER in str(caught.value)
    assert "None file" not in str(caught.value)
    assert not (tmp_path / "ckpts" / "5" / MARKER).exists()
    assert c.resume_point(fresh=True) is None
    adopted = c.mark_complete(5, check=False)  # the caller's decision
    assert adopted.step == 5
