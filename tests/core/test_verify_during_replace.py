"""A step replaced by another commit while it is being verified (an evaluator resuming
verified while the trainer commits that step again) is not damaged: each save of it is
whole. Verifying it used to report the mix of the two saves it read as a checksum
mismatch, so ``verify(step)`` raised VerificationError and a verified resume refused the
root as unusable (or fell back to an older step) although no checkpoint was ever damaged.
Now a verify that fails on a directory replaced meanwhile verifies the new one (a few
times at most); a checkpoint that really is damaged still fails."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from treeutil import write

from atomic_ckpt import CheckpointDir, UnusableCheckpointsError, VerificationError


def _save(c: CheckpointDir, fill: int) -> None:
    with c.commit(1) as path:
        write(path, {f"f{i}.bin": bytes([fill]) * (1000 + i) for i in range(8)})


def _replacing(c: CheckpointDir, times: int) -> tuple[Callable[[int, int], None], list[int]]:
    """A progress callback that commits step 1 again the first ``times`` times a verify
    reports progress from 0 (its start, once the walk began): a concurrent save."""
    done: list[int] = []

    def progress(checked: int, total: int) -> None:
        if checked == 0 and len(done) < times:
            done.append(1)
            _save(c, 100 + len(done))

    return progress, done


def test_verify_of_a_step_replaced_while_it_is_read_verifies_the_new_save(
    tmp_path: Path,
) -> None:
    """Step 1 is committed again right after ``verify(1)`` started: verify returns the
    new save's checkpoint (its manifest: the new one), no VerificationError."""
    c = CheckpointDir(tmp_path / "ckpts", workers=1)
    _save(c, 1)
    progress, done = _replacing(c, 1)
    found = c.verify(1, progress=progress)
    assert done == [1]  # the replacement happened inside the verify
    assert found.manifest.created == c.get(1).manifest.created
    assert (found.path / "f0.bin").read_bytes()[:1] == bytes([101])


def test_a_verified_resume_during_a_replace_resumes_the_new_save(tmp_path: Path) -> None:
    """The same for ``resume_verified``: the replaced step is resumed (its views are the
    new save's bytes), never refused as unusable."""
    c = CheckpointDir(tmp_path / "ckpts", workers=1)
    _save(c, 1)
    calls: list[int] = []
    original = os.scandir

    def scandir(path: object = ".") -> object:  # the verify's walk starts: replace step 1
        mine = isinstance(path, (str, os.PathLike)) and Path(path) == tmp_path / "ckpts" / "1"
        if mine and not calls:
            calls.append(1)
            _save(c, 7)
        return original(path)  # type: ignore[arg-type]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "scandir", scandir)
        found = c.resume_verified(["f0.bin"])
    assert calls == [1]
    assert found is not None
    assert bytes(found.files["f0.bin"])[:1] == bytes([7])


def test_a_damaged_checkpoint_still_fails_verify(tmp_path: Path) -> None:
    """Nothing replaced it: a flipped byte is a VerificationError, and a resume with
    nothing else to resume from refuses the root."""
    c = CheckpointDir(tmp_path / "ckpts", workers=1)
    _save(c, 1)
    target = tmp_path / "ckpts" / "1" / "f3.bin"
    os.chmod(target, 0o644)
    data = bytearray(target.read_bytes())
    data[10] ^= 1
    with open(target, "r+b") as f:
        f.write(data)
    with pytest.raises(VerificationError, match=r"f3\.bin"):
        c.verify(1)
    with pytest.raises(UnusableCheckpointsError, match="does not verify"):
        c.resume_verified(["f0.bin"])
