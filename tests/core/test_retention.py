"""Retention policies (keep_last, keep_every, keep_best) and the checkpoint_best pointer."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest

from atomic_ckpt import BEST_LINK, MARKER, TMP_INFIX, CheckpointDir, RetentionPolicy
from atomic_ckpt._core.l2_syscalls import fs as _fs


def commit(ckpts: CheckpointDir, step: int, **metadata: object) -> None:
    with ckpts.commit(step, metadata=metadata) as path:
        (path / "w.bin").write_bytes(str(step).encode())


def fill(ckpts: CheckpointDir, losses: dict[int, float | None]) -> None:
    for step, loss in losses.items():
        if loss is None:
            commit(ckpts, step)
        else:
            commit(ckpts, step, loss=loss)


def best_link(ckpts: CheckpointDir) -> str | None:
    try:
        return os.readlink(ckpts.root / BEST_LINK)
    except FileNotFoundError:
        return None


def test_keep_last(ckpts: CheckpointDir) -> None:
    """keep_last=k keeps the k newest steps."""
    fill(ckpts, dict.fromkeys(range(1, 7)))
    deleted = ckpts.retain(keep_last=2)
    assert ckpts.steps() == [5, 6]
    assert deleted == [ckpts.path_of(s) for s in (1, 2, 3, 4)]


def test_keep_every(ckpts: CheckpointDir) -> None:
    """keep_every=n keeps steps divisible by n, plus the latest."""
    fill(ckpts, {s: None for s in (10, 20, 25, 30, 35, 41)})
    ckpts.retain(keep_every=10)
    assert ckpts.steps() == [10, 20, 30, 41]


def test_keep_every_and_last_combine(ckpts: CheckpointDir) -> None:
    """The rules keep the union of what each keeps."""
    fill(ckpts, dict.fromkeys(range(1, 11)))
    ckpts.retain(keep_last=2, keep_every=4)
    assert ckpts.steps() == [4, 8, 9, 10]


@pytest.mark.parametrize(("mode", "best"), [("min", 3), ("max", 5)])
def test_keep_best_by_metric(ckpts: CheckpointDir, mode: str, best: int) -> None:
    """keep_best=k keeps the k best by the metric (min or max) and points checkpoint_best."""
    fill(ckpts, {1: 0.9, 2: 0.5, 3: 0.1, 4: 0.3, 5: 1.5, 6: 0.8})
    ckpts.retain(keep_best=2, metric="loss", mode=mode)  # type: ignore[arg-type]
    expected = {"min": [3, 4, 6], "max": [1, 5, 6]}[mode]
    assert ckpts.steps() == expected
    assert best_link(ckpts) == str(best)
    got = ckpts.best()
    assert got is not None
    assert got.step == best


def test_best_is_never_deleted_by_keep_last(ckpts: CheckpointDir) -> None:
    """With a metric, the best survives however small keep_last is."""
    fill(ckpts, {1: 0.5, 2: 0.1, 3: 0.7, 4: 0.8, 5: 0.9})
    ckpts.retain(keep_last=1, metric="loss")
    assert ckpts.steps() == [2, 5]
    assert best_link(ckpts) == "2"


def test_pointed_best_is_protected_without_a_metric(ckpts: CheckpointDir) -> None:
    """A policy without a metric still never deletes the checkpoint checkpoint_best names."""
    fill(ckpts, {1: 0.5, 2: 0.1, 3: 0.7, 4: 0.8})
    ckpts.retain(keep_last=3, metric="loss")
    assert best_link(ckpts) == "2"
    ckpts.retain(keep_last=1)
    assert ckpts.steps() == [2, 4]


def test_best_moves_to_a_better_checkpoint_and_the_old_one_goes(ckpts: CheckpointDir) -> None:
    """A new best moves the pointer first; then the old best may be deleted."""
    policy = RetentionPolicy(keep_last=1, metric="loss")
    for step, loss in [(1, 0.5), (2, 0.6), (3, 0.2), (4, 0.3)]:
        commit(ckpts, step, loss=loss)
        ckpts.retain(policy)
    assert ckpts.steps() == [3, 4]
    assert best_link(ckpts) == "3"


def test_ties_prefer_the_newer_step(ckpts: CheckpointDir) -> None:
    """On equal metrics the newer checkpoint is the best."""
    fill(ckpts, {1: 0.5, 2: 0.5, 3: 0.9})
    ckpts.retain(keep_last=1, metric="loss")
    assert best_link(ckpts) == "2"


def test_checkpoints_without_the_metric_are_never_best(ckpts: CheckpointDir) -> None:
    """Missing, boolean or non-finite metric values do not compete."""
    commit(ckpts, 1, loss=0.1)
    # A marker written by an older version (or by hand) may hold a bare NaN.
    marker = ckpts.path_of(1) / MARKER
    marker.write_text(marker.read_text().replace('"loss": 0.1', '"loss": NaN'))
    assert math.isnan(ckpts.get(1).manifest.metadata["loss"])
    commit(ckpts, 2, loss=True)
    commit(ckpts, 3)
    commit(ckpts, 4, loss="low")
    commit(ckpts, 5, loss=2.0)
    commit(ckpts, 6)
    ckpts.retain(keep_last=1, metric="loss")
    assert ckpts.steps() == [5, 6]
    assert best_link(ckpts) == "5"


def test_no_metric_anywhere_leaves_no_pointer(ckpts: CheckpointDir) -> None:
    """If no checkpoint carries the metric there is no best and no link."""
    fill(ckpts, dict.fromkeys((1, 2, 3)))
    ckpts.retain(keep_last=1, metric="loss")
    assert ckpts.steps() == [3]
    assert best_link(ckpts) is None
    assert ckpts.best() is None


def test_pointer_is_a_relative_symlink_the_scanner_ignores(ckpts: CheckpointDir) -> None:
    """checkpoint_best is a relative symlink; scanning and clean() leave it alone."""
    fill(ckpts, {1: 0.3, 2: 0.4})
    ckpts.retain(keep_last=2, metric="loss")
    link = ckpts.root / BEST_LINK
    assert link.is_symlink()
    assert os.readlink(link) == "1"
    assert ckpts.steps() == [1, 2]
    assert ckpts.clean() == []
    assert (link / "w.bin").read_bytes() == b"1"


def test_pointer_replacement_is_a_rename_then_a_root_fsync(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The link is replaced by renaming a temporary link over it, then the root is fsynced,
    all before any deletion."""
    fill(ckpts, {1: 0.5, 2: 0.1, 3: 0.9})
    calls: list[tuple[str, str]] = []
    real_rename, real_fsync_dir = _fs.rename, _fs.fsync_dir

    def rename(src: Path, dst: Path) -> None:
        calls.append(("rename", f"{src.name}->{dst.name}"))
        real_rename(src, dst)

    def fsync_dir(path: str | os.PathLike[str]) -> None:
        calls.append(("fsync_dir", Path(path).name))
        real_fsync_dir(path)

    monkeypatch.setattr(_fs, "rename", rename)
    monkeypatch.setattr(_fs, "fsync_dir", fsync_dir)
    ckpts.retain(keep_last=1, metric="loss")
    first = calls[0]
    assert first[0] == "rename"
    assert first[1].startswith(f"{BEST_LINK}{TMP_INFIX}")
    assert first[1].endswith(f"->{BEST_LINK}")
    assert calls[1] == ("fsync_dir", ckpts.root.name)
    # Then step 1 is moved aside (renamed) for deletion, and the root fsynced again.
    assert calls[2][0] == "rename"
    assert calls[2][1].startswith("1->1.tmp-del-")
    assert ckpts.steps() == [2, 3]


def test_a_crash_before_the_pointer_rename_leaves_the_old_pointer(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If the pointer cannot be replaced nothing is deleted and the old pointer stands."""
    fill(ckpts, {1: 0.5, 2: 0.7})
    ckpts.retain(keep_last=2, metric="loss")
    commit(ckpts, 3, loss=0.1)
    fired: list[int] = []

    def broken(src: Path, dst: Path) -> None:
        fired.append(1)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(_fs, "rename", broken)
    with pytest.raises(OSError, match="Input/output"):
        ckpts.retain(keep_last=1, metric="loss")
    assert fired == [1]
    assert best_link(ckpts) == "1"
    assert ckpts.steps() == [1, 2, 3]
    assert [n for n in os.listdir(ckpts.root) if n.startswith(TMP_INFIX + BEST_LINK)] == []


def test_leftover_temporary_link_is_cleaned(ckpts: CheckpointDir) -> None:
    """A temporary link left by a crash is removed by clean()."""
    fill(ckpts, {1: 0.5})
    tmp = ckpts.root / f"{BEST_LINK}{TMP_INFIX}{'a' * 32}"
    os.symlink("1", tmp)
    assert tmp in ckpts.clean()
    assert not os.path.lexists(tmp)


def test_best_ignores_a_link_that_leaves_the_root(ckpts: CheckpointDir, tmp_path: Path) -> None:
    """A checkpoint_best pointing anywhere but a sibling step is not a best checkpoint."""
    fill(ckpts, {1: 0.5})
    os.symlink(str(ckpts.path_of(1)), ckpts.root / BEST_LINK)  # absolute: refused
    assert ckpts.best() is None
    os.unlink(ckpts.root / BEST_LINK)
    os.symlink("7", ckpts.root / BEST_LINK)  # dangling
    assert ckpts.best() is None


def test_latest_is_always_kept(ckpts: CheckpointDir) -> None:
    """Even keep_every alone never deletes the latest checkpoint."""
    fill(ckpts, dict.fromkeys((3, 5, 7)))
    ckpts.retain(keep_every=100)
    assert ckpts.steps() == [7]


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"keep_last": 0},
        {"keep_last": -1},
        {"keep_every": 0},
        {"keep_last": True},
        {"keep_best": 2},
        {"metric": "loss", "keep_best": 0},
        {"metric": "loss", "mode": "median"},
        {"metric": ""},
    ],
)
def test_invalid_policies_are_value_errors(kwargs: dict[str, object]) -> None:
    """Policies that would delete everything, or are ill-formed, are refused up front."""
    with pytest.raises(ValueError):  # noqa: PT011
        RetentionPolicy(**kwargs)  # type: ignore[arg-type]


def test_retain_on_a_missing_root_deletes_nothing(tmp_path: Path) -> None:
    """Retention on a root with no checkpoints is a no-op."""
    assert CheckpointDir(tmp_path / "none").retain(keep_last=1, metric="loss") == []


def test_prune_never_deletes_the_best_checkpoint(ckpts: CheckpointDir) -> None:
    """prune() spares the checkpoint that checkpoint_best names, as retain() does."""
    for step, loss in [(1, 0.1), (2, 0.5), (3, 0.9), (4, 0.7)]:
        with ckpts.commit(step, metadata={"loss": loss}) as path:
            (path / "w").write_text(str(step))
    ckpts.retain(keep_last=4, keep_best=1, metric="loss", mode="min")
    best = ckpts.best()
    assert best is not None
    assert best.step == 1
    ckpts.prune(keep_last=1)
    assert ckpts.steps() == [1, 4]
