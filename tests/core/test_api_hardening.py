"""Issue 30's API edges: every step-or-name argument takes a step the way ``ls`` shows it
(``"5"``, in a prefixed root too), a single string is never taken as a set of paths,
``delete(missing_ok=True)``, and one call for "where this step's files are now"."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomic_ckpt import (
    CheckpointDir,
    CheckpointNotFoundError,
    UnmarkedCheckpointsError,
    UnusableCheckpointsError,
    VerificationError,
)
from atomic_ckpt import distributed as adist


def _commit(ckpts: CheckpointDir, step: int, text: bytes = b"weights") -> None:
    with ckpts.commit(step) as path:
        (path / "model.pt").write_bytes(text)


@pytest.fixture
def prefixed(tmp_path: Path) -> CheckpointDir:
    """A ``checkpoint-N`` root holding step 5 with an alias."""
    ckpts = CheckpointDir(tmp_path / "run", prefix="checkpoint-")
    with ckpts.commit(5, aliases=["epoch1"]) as path:
        (path / "model.pt").write_bytes(b"w")
    return ckpts


# ---------------------------------------------------------------- 12, 17: "5" is step 5


def test_a_prefixed_root_takes_the_step_as_ls_shows_it_in_aliases(
    prefixed: CheckpointDir,
) -> None:
    """``aliases("5")`` in a ``checkpoint-`` root answers for step 5."""
    assert prefixed.aliases("5") == ["epoch1"]
    assert prefixed.aliases("checkpoint-5") == ["epoch1"]


def test_a_prefixed_root_takes_the_step_as_ls_shows_it_in_delete(
    prefixed: CheckpointDir,
) -> None:
    """``delete("5")`` in a ``checkpoint-`` root deletes step 5."""
    assert prefixed.delete("5") == prefixed.path_of(5)
    assert prefixed.steps() == []


def test_a_prefixed_root_takes_the_step_as_ls_shows_it_in_staging(
    prefixed: CheckpointDir,
) -> None:
    """``staging("5")`` in a ``checkpoint-`` root finds the open commit of step 5."""
    with prefixed.commit(6) as path:
        assert prefixed.staging("6") == path
        assert prefixed.staging("checkpoint-6") == path


def test_rank0_commit_takes_a_step_given_as_a_string(ckpts: CheckpointDir) -> None:
    """``rank0_commit(ckpts, "4")`` commits step 4, as ``staging("4")`` finds step 4."""
    with adist.rank0_commit(ckpts, "4") as path:
        assert path is not None
        assert ckpts.staging("4") == path
        (path / "model.pt").write_bytes(b"w")
    assert ckpts.steps() == [4]
    assert ckpts.named() == []


def test_rank0_commit_takes_a_prefixed_step_name(tmp_path: Path) -> None:
    """In a ``checkpoint-`` root, ``rank0_commit`` takes ``"4"`` and ``"checkpoint-4"``."""
    ckpts = CheckpointDir(tmp_path / "run", prefix="checkpoint-")
    with adist.rank0_commit(ckpts, "4") as path:
        assert path is not None
    with adist.rank0_commit(ckpts, "checkpoint-7") as path:
        assert path is not None
    assert ckpts.steps() == [4, 7]


# ---------------------------------------------------------------- 13: one string


@pytest.mark.parametrize("carry", ["4/model.pt", ["model.pt"]], ids=["one-string", "a-list"])
def test_carry_that_is_not_a_mapping_is_a_type_error_and_stages_nothing(
    ckpts: CheckpointDir, carry: object
) -> None:
    """``commit(5, carry="model.pt")`` (or a list) is a TypeError showing the mapping it
    takes, not ``'str' object has no attribute 'items'``; nothing is committed or left."""
    _commit(ckpts, 4)
    with (
        pytest.raises(TypeError, match="maps each relative path"),
        ckpts.commit(
            5,
            carry=carry,  # type: ignore[arg-type]
        ) as path,
    ):
        (path / "b.bin").write_bytes(b"b")
    assert ckpts.steps() == [4]
    assert [p.name for p in ckpts.root.iterdir()] == ["4"]


def test_resume_verified_refuses_a_single_string_as_read(ckpts: CheckpointDir) -> None:
    """``resume_verified("model.pt")`` is a TypeError, not a set of characters."""
    _commit(ckpts, 1)
    with pytest.raises(TypeError, match="not one string"):
        ckpts.resume_verified("model.pt")


def test_distributed_resume_verified_refuses_a_single_string_as_read(
    ckpts: CheckpointDir,
) -> None:
    """The distributed ``resume_verified`` refuses one string as ``read`` too."""
    _commit(ckpts, 1)
    with pytest.raises(TypeError, match="not one string"):
        adist.resume_verified(ckpts, "model.pt")


def test_sync_files_refuses_a_single_string_as_paths(ckpts: CheckpointDir, tmp_path: Path) -> None:
    """``sync_files(d, "model.pt")`` is a TypeError, not the files m, o, d, ..."""
    (tmp_path / "model.pt").write_bytes(b"w")
    with pytest.raises(TypeError, match="not one string"):
        ckpts.sync_files(tmp_path, "model.pt")


# ---------------------------------------------------------------- 18: missing_ok


def test_delete_of_an_absent_named_checkpoint_with_missing_ok_returns_none(
    ckpts: CheckpointDir,
) -> None:
    """``delete(name, missing_ok=True)`` of a name that is not there returns None."""
    _commit(ckpts, 1)
    assert ckpts.delete("interrupted", missing_ok=True) is None
    with pytest.raises(CheckpointNotFoundError):
        ckpts.delete("interrupted")


def test_delete_with_missing_ok_of_a_missing_root_or_step_returns_none(
    ckpts: CheckpointDir,
) -> None:
    """``missing_ok`` covers a root not yet created and an absent step as well."""
    assert ckpts.delete("interrupted", missing_ok=True) is None
    assert ckpts.delete(3, missing_ok=True) is None
    _commit(ckpts, 1)
    assert ckpts.delete(3, missing_ok=True) is None


def test_delete_with_missing_ok_still_deletes_a_present_one(ckpts: CheckpointDir) -> None:
    """``missing_ok`` changes only the absent case."""
    with ckpts.commit_named("interrupted") as path:
        (path / "model.pt").write_bytes(b"w")
    assert ckpts.delete("interrupted", missing_ok=True) == ckpts.root / "interrupted"
    assert ckpts.named() == []


def test_delete_with_missing_ok_still_refuses_an_incomplete_directory(
    ckpts: CheckpointDir,
) -> None:
    """A directory that is there but incomplete is not "missing": still an error."""
    _commit(ckpts, 1)
    (ckpts.root / "3").mkdir()
    with pytest.raises(CheckpointNotFoundError, match="3"):
        ckpts.delete(3, missing_ok=True)


# ---------------------------------------------------------------- 19: dir_of


def test_dir_of_is_the_open_staging_dir_then_the_committed_one(ckpts: CheckpointDir) -> None:
    """``dir_of(step)``: this process's open staging directory, else the committed one."""
    with ckpts.commit(2) as path:
        assert ckpts.dir_of(2) == path
        assert ckpts.dir_of("2") == path
        (path / "model.pt").write_bytes(b"w")
    assert ckpts.dir_of(2) == ckpts.path_of(2)


def test_dir_of_a_named_checkpoint(ckpts: CheckpointDir) -> None:
    """``dir_of(name)`` answers for named checkpoints the same way."""
    with ckpts.commit_named("interrupted") as path:
        assert ckpts.dir_of("interrupted") == path
    assert ckpts.dir_of("interrupted") == ckpts.root / "interrupted"


def test_dir_of_neither_open_nor_committed_is_not_found(ckpts: CheckpointDir) -> None:
    """With no open commit and no complete checkpoint, ``dir_of`` says so."""
    _commit(ckpts, 1)
    (ckpts.root / "3").mkdir()
    for target in (3, 4, "interrupted"):
        with pytest.raises(CheckpointNotFoundError):
            ckpts.dir_of(target)


# ---------------------------------------------------------------- 16: mark_complete(require=)


def _legacy(ckpts: CheckpointDir, step: int, *names: str) -> Path:
    """A step directory written without atomic_ckpt, holding ``names``."""
    path = ckpts.path_of(step)
    path.mkdir(parents=True)
    for name in names:
        (path / name).write_text("{}")
    return path


def test_mark_complete_refuses_a_directory_missing_a_required_file(
    ckpts: CheckpointDir,
) -> None:
    """``require=`` names files a complete save holds; one missing is refused, by name."""
    path = _legacy(ckpts, 3, "model.json")
    with pytest.raises(VerificationError) as caught:
        ckpts.mark_complete(3, require=["model.json", "optimizer.json", "sub/rng.json"])
    err = caught.value
    assert "optimizer.json" in str(err)
    assert "sub/rng.json" in str(err)
    assert "model.json" not in " ".join(err.problems)
    assert err.problems == (
        f"{path / 'optimizer.json'}: missing",
        f"{path / 'sub/rng.json'}: missing",
    )
    assert ckpts.steps() == []  # nothing adopted


def test_mark_complete_with_every_required_file_adopts(ckpts: CheckpointDir) -> None:
    """With every required file present it adopts as usual."""
    _legacy(ckpts, 3, "model.json", "optimizer.json")
    ckpt = ckpts.mark_complete(3, require=["model.json", "optimizer.json"])
    assert ckpts.steps() == [3]
    assert sorted(f.path for f in ckpt.manifest.files) == ["model.json", "optimizer.json"]


def test_mark_complete_require_is_checked_even_with_check_false(ckpts: CheckpointDir) -> None:
    """``check=False`` skips the format checks, never the caller's own ``require``."""
    _legacy(ckpts, 3, "model.json")
    with pytest.raises(VerificationError, match=r"optimizer\.json"):
        ckpts.mark_complete(3, check=False, require=["optimizer.json"])


def test_mark_complete_require_refuses_one_string_and_paths_outside(ckpts: CheckpointDir) -> None:
    """``require="model.json"`` and paths leaving the directory are refused."""
    _legacy(ckpts, 3, "model.json")
    with pytest.raises(TypeError, match="not one string"):
        ckpts.mark_complete(3, require="model.json")
    with pytest.raises(ValueError, match="inside the checkpoint"):
        ckpts.mark_complete(3, require=["../model.json"])


# ---------------------------------------------------------------- 20: decided at resume


def test_a_plan_scanned_early_raises_only_where_the_resume_is_decided(
    ckpts: CheckpointDir,
) -> None:
    """``resume_plan()`` over unusable directories raises nothing until ``resume()``,
    which refuses, or with ``fresh=True`` starts over: the decision of the resume site."""
    (ckpts.root / "3").mkdir(parents=True)  # unmarked: written before atomic_ckpt
    plan = ckpts.resume_plan()  # a trainer's constructor: no decision yet
    assert plan.checkpoint is None
    assert isinstance(plan.refusal, UnmarkedCheckpointsError)
    with pytest.raises(UnmarkedCheckpointsError):
        plan.resume()
    assert plan.resume(fresh=True) is None


def test_a_plan_resumes_what_resume_point_resumes(ckpts: CheckpointDir) -> None:
    """With a checkpoint to resume from, the plan holds it and ``resume`` returns it."""
    _commit(ckpts, 1)
    _commit(ckpts, 2)
    plan = ckpts.resume_plan(verify=True)
    assert plan.refusal is None
    assert plan.resume() == plan.resume(fresh=True) == ckpts.resume_point()


def test_a_plan_below_a_moved_checkpoint_refuses_fresh_or_not(ckpts: CheckpointDir) -> None:
    """A refusal that ``fresh`` does not lift (a moved checkpoint above) holds at resume."""
    _commit(ckpts, 1)
    with ckpts.commit_named("interrupted") as path:
        (path / "model.pt").write_bytes(b"w")
    (ckpts.root / "interrupted").rename(ckpts.path_of(5))
    plan = ckpts.resume_plan()
    assert plan.checkpoint is not None
    assert plan.checkpoint.step == 1
    for fresh in (False, True):
        with pytest.raises(UnusableCheckpointsError, match="atomic-ckpt promote"):
            plan.resume(fresh=fresh)


def test_remove_alias_with_missing_ok_of_an_absent_alias_does_nothing(
    ckpts: CheckpointDir,
) -> None:
    """``remove_alias(name, missing_ok=True)`` takes an absent alias (or root) quietly."""
    ckpts.remove_alias("best-so-far", missing_ok=True)  # no root yet
    with ckpts.commit(1, aliases=["epoch0"]) as path:
        (path / "model.pt").write_bytes(b"w")
    ckpts.remove_alias("best-so-far", missing_ok=True)
    ckpts.remove_alias("epoch0", missing_ok=True)
    assert ckpts.aliases(1) == []
    with pytest.raises(CheckpointNotFoundError):
        ckpts.remove_alias("epoch0")
