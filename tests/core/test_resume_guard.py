"""The resume guard: a root that holds step directories but nothing to resume from refuses
a fresh start (which would train from step 0 and commit over them), saying what is there
and why it cannot be used; ``fresh=True`` starts over deliberately."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
from treeutil import contents, write

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CheckpointError,
    UnmarkedCheckpointsError,
    UnusableCheckpointsError,
)


def committed(ckpts: CheckpointDir, step: int) -> Path:
    with ckpts.commit(step) as path:
        write(path, {"model.bin": b"weights %d" % step})
    return ckpts.path_of(step)


def newer_format(path: Path) -> None:
    """Rewrite ``path``'s marker as a later format version would write it."""
    marker = path / MARKER
    marker.write_bytes(marker.read_bytes().replace(b'"version": 2', b'"version": 3', 1))


def damage(path: Path) -> None:
    """Change a file's bytes (same size): the marker still reads, verify fails."""
    (path / "model.bin").write_bytes(b"W" * len((path / "model.bin").read_bytes()))


def test_a_step_of_a_newer_format_version_stops_a_resume(ckpts: CheckpointDir) -> None:
    """A marker this version cannot read (format version 3): UnusableCheckpointsError naming
    the directory and the reason, not None (a job from step 0 would commit over it)."""
    newer_format(committed(ckpts, 3))
    with pytest.raises(UnusableCheckpointsError) as info:
        ckpts.resume_point()
    err = info.value
    assert isinstance(err, CheckpointError)
    assert isinstance(err, FileExistsError)
    assert err.paths == (ckpts.path_of(3),)
    assert "version 3" in str(err)
    assert str(ckpts.path_of(3)) in str(err)
    assert "from scratch deliberately" in str(err)  # the remedy, in the user's terms
    assert "fresh=True" not in str(err)  # no library switch an application's user can't pass
    assert err.problems == (f"{ckpts.path_of(3)}: {err.problems[0].split(': ', 1)[1]}",)
    assert ckpts.resume_point(fresh=True) is None
    assert ckpts.path_of(3).is_dir()


def test_a_non_empty_legacy_marker_stops_a_resume(ckpts: CheckpointDir) -> None:
    """A marker that is neither empty nor a manifest ("done\\n"): refused, with the reason."""
    path = committed(ckpts, 4)
    (path / MARKER).write_bytes(b"done\n")
    with pytest.raises(UnusableCheckpointsError, match="not valid JSON") as info:
        ckpts.resume_point()
    assert info.value.paths == (path,)
    assert contents(path)["model.bin"] == b"weights 4"


def test_nothing_that_verifies_stops_a_verified_resume(ckpts: CheckpointDir) -> None:
    """verify=True where every complete checkpoint fails verification: refused, each named
    with what failed; verify=False resumes from the newest as before."""
    for step in (1, 2):
        damage(committed(ckpts, step))
    with pytest.raises(UnusableCheckpointsError, match="does not verify") as info:
        ckpts.resume_point(verify=True)
    assert info.value.paths == (ckpts.path_of(1), ckpts.path_of(2))
    assert "model.bin" in str(info.value)
    assert ckpts.resume_point(verify=True, fresh=True) is None
    found = ckpts.resume_point()
    assert found is not None
    assert found.step == 2


def test_the_newest_checkpoint_that_verifies_is_still_resumed(ckpts: CheckpointDir) -> None:
    """A damaged newest step beside a good older one: the older one, as latest(verify=True)."""
    committed(ckpts, 1)
    damage(committed(ckpts, 2))
    found = ckpts.resume_point(verify=True)
    assert found is not None
    assert found.step == 1


def test_unmarked_and_unreadable_dirs_are_listed_together(ckpts: CheckpointDir) -> None:
    """Both kinds at once: one UnusableCheckpointsError listing each with its reason."""
    write(ckpts.root / "1", {"model.bin": b"pre-atomic_ckpt"})
    newer_format(committed(ckpts, 2))
    with pytest.raises(UnusableCheckpointsError) as info:
        ckpts.resume_point()
    err = info.value
    assert not isinstance(err, UnmarkedCheckpointsError)
    assert err.paths == (ckpts.path_of(1), ckpts.path_of(2))
    assert "mark-complete" in str(err)
    assert "version 3" in str(err)


def test_only_unmarked_dirs_are_still_unmarked_checkpoints_error(ckpts: CheckpointDir) -> None:
    """The unmarked-only case keeps its own error, a member of the same family."""
    write(ckpts.root / "1", {"model.bin": b"pre-atomic_ckpt"})
    with pytest.raises(UnmarkedCheckpointsError) as info:
        ckpts.resume_point()
    assert isinstance(info.value, UnusableCheckpointsError)


def test_the_error_pickles_with_its_paths_and_problems(ckpts: CheckpointDir) -> None:
    """It crosses a process boundary (distributed.resume broadcasts rank 0's) intact."""
    newer_format(committed(ckpts, 3))
    with pytest.raises(UnusableCheckpointsError) as info:
        ckpts.resume_point()
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is UnusableCheckpointsError
    assert copy.paths == info.value.paths
    assert copy.problems == info.value.problems
    assert len(copy.problems) == 1
    assert str(copy) == str(info.value)


def test_an_empty_or_missing_root_is_still_a_fresh_start(ckpts: CheckpointDir) -> None:
    """No step directories at all: None, nothing to protect."""
    assert ckpts.resume_point() is None
    ckpts.root.mkdir()
    (ckpts.root / "notes.txt").write_text("not a step")
    assert ckpts.resume_point(verify=True) is None


def test_torch_resume_applies_the_same_guard(ckpts: CheckpointDir) -> None:
    """atomic_ckpt.torch.resume raises it too, and fresh=True passes through."""
    torch = pytest.importorskip("torch")
    from atomic_ckpt.torch import resume

    newer_format(committed(ckpts, 3))
    model = torch.nn.Linear(2, 1)
    with pytest.raises(UnusableCheckpointsError):
        resume(ckpts, model=model)
    assert resume(ckpts, model=model, fresh=True) is None
