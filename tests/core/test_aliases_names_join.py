"""What a trainer's glue needs: aliases that follow their step, names wherever steps go
(``staging``, ``begin_named``, ``delete``, the CLI's ``promote`` and ``rm``), and joining
an open commit from a save function that also runs alone."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from treeutil import contents, write

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError, CommitStateError
from atomic_ckpt.cli import main

OLD, NEW = {"model.bin": b"old save"}, {"model.bin": b"new save"}


def aliases_on_disk(ckpts: CheckpointDir) -> dict[str, str]:
    return {
        p.name: os.readlink(p)
        for p in ckpts.root.iterdir()
        if p.is_symlink() and p.name != "checkpoint_best"
    }


# ---------------------------------------------------------------- aliases that follow their step


def test_replace_aliases_makes_the_commits_aliases_the_steps_only_ones(
    ckpts: CheckpointDir,
) -> None:
    """Re-saving epoch 0 at step 6 under ``epoch0_step6`` drops ``epoch0_step3 -> 0``; other
    steps' aliases stay."""
    with ckpts.commit(0, aliases=["epoch0_step3", "epoch0"]) as path:
        write(path, OLD)
    with ckpts.commit(1, aliases=["epoch1_step9"]) as path:
        write(path, OLD)
    with ckpts.commit(0, aliases=["epoch0_step6", "epoch0"], replace_aliases=True) as path:
        write(path, NEW)
    assert ckpts.aliases(0) == ["epoch0", "epoch0_step6"]
    assert ckpts.aliases(1) == ["epoch1_step9"]
    assert aliases_on_disk(ckpts) == {"epoch0": "0", "epoch0_step6": "0", "epoch1_step9": "1"}


def test_without_replace_aliases_they_accumulate_as_before(ckpts: CheckpointDir) -> None:
    """The default keeps every alias (``replace_aliases`` is opt-in)."""
    with ckpts.commit(2, aliases=["a"]) as path:
        write(path, OLD)
    with ckpts.commit(2, aliases=["b"]) as path:
        write(path, NEW)
    assert ckpts.aliases(2) == ["a", "b"]


def test_remove_alias_removes_the_link_and_not_the_checkpoint(ckpts: CheckpointDir) -> None:
    """remove_alias drops one alias durably; a missing alias is CheckpointNotFoundError."""
    with ckpts.commit(3, aliases=["best_so_far", "epoch1"]) as path:
        write(path, OLD)
    ckpts.remove_alias("best_so_far")
    assert ckpts.aliases(3) == ["epoch1"]
    assert ckpts.verify(3).step == 3
    with pytest.raises(CheckpointNotFoundError):
        ckpts.remove_alias("best_so_far")
    with pytest.raises(ValueError, match="alias"):
        ckpts.remove_alias("3")  # a step is never an alias


_KILL_CHILD = """
import os, sys
from pathlib import Path
from atomic_ckpt import CheckpointDir
from atomic_ckpt._core.l2_syscalls import fs as _fs
kill_at, root, mode = int(sys.argv[1]), sys.argv[2], sys.argv[3]
calls = [0]
def counting(real):
    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == kill_at:
            os._exit(9)
        return real(*args, **kwargs)
    return call
for name in _fs.__all__:
    if callable(getattr(_fs, name)):
        setattr(_fs, name, counting(getattr(_fs, name)))
ckpts = CheckpointDir(root)
if mode == "aliases":
    with ckpts.commit(0, aliases=["epoch0_step6", "epoch0"], replace_aliases=True) as path:
        (path / "model.bin").write_bytes(b"new save")
else:
    from atomic_ckpt.cli import main
    sys.exit(main(["promote", root, "interrupted", "5"]))
"""


def _kill_states(tmp_path: Path, mode: str, prepare: object) -> list[Path]:
    """Run the child killed at its 1st, 2nd, ... syscall-module call until one runs to the
    end; return each killed run's root (every kill point is hit exactly once)."""
    roots = []
    for kill_at in range(1, 200):
        root = tmp_path / f"run{kill_at}"
        prepare(CheckpointDir(root))  # type: ignore[operator]
        child = subprocess.run(
            [sys.executable, "-c", _KILL_CHILD, str(kill_at), str(root), mode],
            capture_output=True,
            text=True,
            check=False,
        )
        if child.returncode == 0:
            assert kill_at > 3, "the child finished before any kill point: nothing was tested"
            return roots
        assert child.returncode == 9, child.stderr  # killed at the injected point
        roots.append(root)
    raise AssertionError("the child never finished")


def _old_epoch(ckpts: CheckpointDir) -> None:
    with ckpts.commit(0, aliases=["epoch0_step3", "epoch0"]) as path:
        write(path, OLD)


def test_a_kill_at_any_point_of_an_alias_replacement_leaves_no_lying_or_dangling_alias(
    tmp_path: Path,
) -> None:
    """Killed at every syscall boundary of a re-save with replace_aliases: every alias names
    the step, the old aliases only ever name the old save and the new ones the new save;
    the step itself is the old save or the new one."""
    states = _kill_states(tmp_path, "aliases", _old_epoch)
    seen = set()
    for root in states:
        ckpts = CheckpointDir(root)
        ckpts.clean()
        data = contents(ckpts.path_of(0))
        assert data in (OLD, NEW), root
        links = aliases_on_disk(ckpts)
        assert set(links.values()) <= {"0"}, links  # nothing dangles or points elsewhere
        if data == OLD:
            assert "epoch0_step6" not in links, root
        else:
            assert "epoch0_step3" not in links, root
        seen.add((data == NEW, tuple(sorted(links))))
    assert (False, ("epoch0", "epoch0_step3")) in seen  # killed before anything changed
    assert any(new for new, _ in seen)  # and after the promotion


def _interrupted(ckpts: CheckpointDir) -> None:
    with ckpts.commit(5) as path:
        write(path, OLD)
    with ckpts.commit_named("interrupted") as path:
        write(path, NEW)


def test_a_kill_at_any_point_of_cli_promote_leaves_the_old_step_or_the_promoted_one(
    tmp_path: Path,
) -> None:
    """``atomic-ckpt promote ROOT interrupted 5`` killed anywhere: step 5 is the old save or
    the promoted one, never missing, and a complete ``interrupted`` never vanishes unpromoted."""
    for root in _kill_states(tmp_path, "promote", _interrupted):
        ckpts = CheckpointDir(root)
        ckpts.clean()
        step = contents(ckpts.path_of(5))
        assert step in (OLD, NEW), root
        if step == OLD:
            assert contents(ckpts.get_named("interrupted").path) == NEW, root


# ---------------------------------------------------------------- names wherever steps go


def test_names_work_where_steps_do(ckpts: CheckpointDir) -> None:
    """begin_named/finish, staging(name), aliases(name) and delete(name)."""
    handle = ckpts.begin_named("interrupted", aliases=["latest_interrupt"])
    assert ckpts.staging("interrupted") == handle.path
    write(handle.path, NEW)
    handle.finish()
    assert ckpts.staging("interrupted") is None
    assert ckpts.aliases("interrupted") == ["latest_interrupt"]
    with ckpts.begin_named("other") as h:
        write(h.path, OLD)
    assert [n.name for n in ckpts.named()] == ["interrupted", "other"]
    ckpts.delete("interrupted")
    assert [n.name for n in ckpts.named()] == ["other"]
    assert aliases_on_disk(ckpts) == {}  # its alias went with it
    with pytest.raises(CheckpointNotFoundError):
        ckpts.delete("interrupted")
    with ckpts.commit(4) as path:
        write(path, OLD)
    ckpts.delete("4")  # a step's name is the step
    assert ckpts.steps() == []


def test_cli_promote_and_rm(ckpts: CheckpointDir, capsys: pytest.CaptureFixture[str]) -> None:
    """promote ROOT NAME STEP and rm ROOT STEP|NAME, with the CLI's exit codes."""
    _interrupted(ckpts)
    root = str(ckpts.root)
    assert main(["promote", root, "interrupted", "5"]) == 0
    assert contents(ckpts.path_of(5)) == NEW
    assert ckpts.named() == []
    assert main(["promote", root, "interrupted", "6"]) == 1  # nothing there any more
    assert main(["rm", root, "5"]) == 0
    assert ckpts.steps() == []
    assert main(["rm", root, "5"]) == 1
    assert main(["rm", root, "no-such-name"]) == 1
    assert main(["rm", root, "bad/name"]) == 2
    out = capsys.readouterr().out
    assert "promoted interrupted to step 5" in out
    assert "removed step 5" in out


# ---------------------------------------------------------------- joining an open commit


def save_model(ckpts: CheckpointDir, step: int) -> None:
    """A save function that commits when called alone and adds to an open commit."""
    with ckpts.commit(step, join=True) as path:
        write(path, {"model.bin": b"weights"})


def test_join_adds_to_the_open_commit_and_the_outermost_publishes(ckpts: CheckpointDir) -> None:
    """Inside a trainer's commit the save function writes into it and publishes nothing."""
    with ckpts.commit(7) as path:
        save_model(ckpts, 7)
        assert ckpts.steps() == []  # the joined block did not publish
        write(path, {"scheduler.pt": b"sched"})
    assert sorted(contents(ckpts.path_of(7))) == ["model.bin", "scheduler.pt"]


def test_join_alone_commits(ckpts: CheckpointDir) -> None:
    """Called with no open commit, the same save function commits by itself."""
    save_model(ckpts, 8)
    assert contents(ckpts.path_of(8)) == {"model.bin": b"weights"}


def test_an_error_in_a_joined_block_aborts_the_outer_commit(ckpts: CheckpointDir) -> None:
    """Even if the caller swallows it, the outer commit is aborted and never publishes a
    half-written checkpoint."""

    def trainer_save() -> None:
        with ckpts.commit(9) as path:
            write(path, {"a": b"a"})
            try:
                with ckpts.commit(9, join=True):
                    raise OSError("disk full halfway on purpose")
            except OSError:
                pass  # the trainer carries on, as buggy glue does

    with pytest.raises(CommitStateError):
        trainer_save()
    assert ckpts.steps() == []
    assert ckpts.staging(9) is None


def test_threads_join_the_same_open_commit(ckpts: CheckpointDir) -> None:
    """Writers in other threads join the trainer's open commit; all their files land."""
    with ckpts.commit(10):
        workers = [
            threading.Thread(
                target=lambda i=i: write(
                    _joined_path(ckpts, 10), {f"shard{i}.bin": bytes([i]) * 10}
                )
            )
            for i in range(4)
        ]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    assert sorted(contents(ckpts.path_of(10))) == [f"shard{i}.bin" for i in range(4)]


def _joined_path(ckpts: CheckpointDir, step: int) -> Path:
    with ckpts.commit(step, join=True) as path:
        return path


def test_join_for_named_checkpoints(ckpts: CheckpointDir) -> None:
    """commit_named(join=True) adds to an open named commit the same way."""
    with ckpts.commit_named("interrupted"):
        with ckpts.commit_named("interrupted", join=True) as inner:
            write(inner, NEW)
        assert ckpts.named() == []
    assert contents(ckpts.get_named("interrupted").path) == NEW
