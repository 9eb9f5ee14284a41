"""Real I/O faults (issue 3, point 4).

EIO and ENOSPC injected at every call a commit (or a prune) makes to
atomic_ckpt._core.l2_syscalls.fs: the calls of one commit are enumerated first, then for each N
a fresh root runs the same commit failing at call N. And a real full disk: a
2 MiB tmpfs and a small loop-mounted ext4 filled during a save.
"""

from __future__ import annotations

import errno
import logging
import os
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import pytest
from _real_mounts import Mounter, mount_or_skip
from _real_support import (
    FSYNCS,
    STATS,
    Event,
    FsHook,
    Save,
    check_root,
    commit_save,
    forced_fallback,
    leftovers,
    new_dir,
    plan_of,
)

from atomic_ckpt import DiskFullError, NotDurableError

pytestmark = pytest.mark.slow  # the slow tier (docs/contributing.md): python -m pytest -m slow

SEED = 11
ERRNOS = (errno.EIO, errno.ENOSPC)
SCENARIOS = {"new": 3, "replace": 1, "fallback": 1}
"""The faulted commit (save 2) commits this step after saves 0 and 1 (steps 1 and 2)."""


def prepared(root: Path, steps: tuple[int, ...]) -> None:
    """Commit ``steps`` (saves 0, 1, ...) without any fault."""
    ckpts = new_dir(root)
    for save in plan_of(list(steps)):
        commit_save(ckpts, SEED, save)


def mode(scenario: str) -> AbstractContextManager[None]:
    return forced_fallback() if scenario == "fallback" else nullcontext()


class Fault:
    """Fails call number ``at`` with ``err`` (instead of making it) and records that it fired."""

    def __init__(self, at: int, err: int) -> None:
        self.at = at
        self.err = err
        self.fired: Event | None = None
        self.error: OSError | None = None

    def __call__(self, event: Event) -> None:
        if event.index == self.at:
            self.fired = event
            self.error = OSError(self.err, f"{os.strerror(self.err)} (injected)", event.path)
            raise self.error


def record_commit(root: Path, scenario: str) -> list[Event]:
    """The _fs calls of the scenario's commit, in order."""
    prepared(root, (1, 2))
    hook = FsHook()
    with mode(scenario), hook.installed():
        # One worker: the calls come in a fixed order, so fault N hits the same call.
        commit_save(new_dir(root, workers=1), SEED, Save(2, SCENARIOS[scenario]))
    return hook.events


def phases(events: list[Event]) -> dict[int, str]:
    """Each call's phase: ``before`` promotion (or the promotion), ``durable``, ``cleanup``."""
    promote = max(e.index for e in events if e.name in ("rename_noreplace", "rename_exchange"))
    out = {}
    for e in events:
        if e.index <= promote:
            out[e.index] = "before"
        elif e.name in FSYNCS:
            out[e.index] = "durable"  # step 6: the root fsync
        else:
            assert e.name == "remove_tree", f"unexpected call after the promotion: {e}"
            out[e.index] = "cleanup"  # step 7: removing the old copy
    return out


@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_fault_at_every_call_of_a_commit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, scenario: str, err: int
) -> None:
    """A fault at any _fs call: the error surfaces, old checkpoints stay, nothing is left over."""
    events = record_commit(tmp_path / "record", scenario)
    phase = phases(events)
    step = SCENARIOS[scenario]
    plan = plan_of([1, 2, step])
    seen = Counter[str]()
    for n in range(1, len(events) + 1):
        root = tmp_path / str(n)
        prepared(root, (1, 2))
        fault = Fault(n, err)
        hook = FsHook(before=fault)
        caplog.clear()
        raised: BaseException | None = None
        with mode(scenario), hook.installed(), caplog.at_level(logging.WARNING, "atomic_ckpt"):
            try:
                commit_save(new_dir(root, workers=1), SEED, plan[2])
            except OSError as exc:
                raised = exc
        assert fault.fired is not None, f"the fault at call {n} did not fire"
        where = f"{err} at call {n} ({fault.fired.name} {fault.fired.path}, {phase[n]})"
        seen[fault.fired.name] += 1
        if phase[n] == "before":
            # The injected error itself, or (a full disk) the DiskFullError that says what
            # to do, raised from it.
            full = isinstance(raised, DiskFullError) and raised.__cause__ is fault.error
            assert raised is fault.error or full, f"{where}: raised {raised!r}"
            assert check_root(root, SEED, plan, 2) == {1: 0, 2: 1}, f"{where}: promoted"
            assert leftovers(root) == [], f"{where}: left {leftovers(root)}"
        elif phase[n] == "durable":
            assert isinstance(raised, NotDurableError), f"{where}: raised {raised!r}"
            assert raised.__cause__ is fault.error
            assert "visible" in str(raised)
            assert "power loss" in str(raised)
            assert check_root(root, SEED, plan, 3)[step] == 2
        else:
            assert raised is None, f"{where}: a failed removal of the old copy failed the commit"
            assert "clean() will" in caplog.text
            assert check_root(root, SEED, plan, 3)[step] == 2
            assert leftovers(root), f"{where}: the old copy should still be there"
        if fault.fired.name in FSYNCS:
            same = [e for e in hook.events if e.name in FSYNCS and e.path == fault.fired.path]
            assert all(e.index <= n for e in same), f"{where}: fsync retried: {same}"
        new_dir(root).clean()
        assert leftovers(root) == [], f"{where}: clean() left {leftovers(root)}"
        assert check_root(root, SEED, plan, 3 if phase[n] != "before" else 2)
    assert {"fsync_fd", "fsync_file", "fsync_dir", "write_file_durable"} <= set(seen)
    expected = {"before", "durable"} | ({"cleanup"} if scenario != "new" else set())
    assert set(phase.values()) == expected
    STATS[f"faults injected: {errno.errorcode[err]} at every _fs call of a commit"] += len(events)


def test_fsync_error_is_never_retried(tmp_path: Path) -> None:
    """EIO from the fsync of a file fails the commit; that file is fsynced exactly once."""
    prepared(tmp_path, (1,))
    calls: list[Event] = []

    def fail_model_fsync(event: Event) -> None:
        if event.name == "fsync_fd" and event.path.endswith("/model.bin"):
            calls.append(event)
            raise OSError(errno.EIO, "Input/output error (injected)", event.path)

    hook = FsHook(before=fail_model_fsync)
    with hook.installed(), pytest.raises(OSError, match="injected") as info:
        commit_save(new_dir(tmp_path), SEED, Save(1, 2))
    assert info.value.errno == errno.EIO
    assert len(calls) == 1, f"model.bin was fsynced {len(calls)} times"
    assert check_root(tmp_path, SEED, plan_of([1, 2]), 1) == {1: 0}
    assert leftovers(tmp_path) == []
    STATS["faults injected: EIO on a file's fsync (no-retry check)"] += 1


@pytest.mark.parametrize("err", ERRNOS, ids=errno.errorcode.get)
def test_fault_at_every_call_of_a_prune(tmp_path: Path, err: int) -> None:
    """A fault at any _fs call of prune: the latest stays, no lock leaks, clean() tidies."""
    record = tmp_path / "record"
    prepared(record, (1, 2, 3))
    hook = FsHook()
    with hook.installed():
        new_dir(record).prune(keep_last=1)
    plan = plan_of([1, 2, 3])
    # A prune that made no _fs call would leave nothing to fault (and the loop would pass
    # vacuously): the recorded one must delete steps 1 and 2 through the hooked calls.
    assert new_dir(record).steps() == [3]
    names = {e.name for e in hook.events}
    assert {"rename", "remove_tree"} <= names, f"the recorded prune made no deletion: {names}"
    assert names & set(FSYNCS), f"the recorded prune made no fsync: {names}"
    for n in range(1, len(hook.events) + 1):
        root = tmp_path / str(n)
        prepared(root, (1, 2, 3))
        fault = Fault(n, err)
        with FsHook(before=fault).installed(), pytest.raises(OSError, match="injected") as info:
            new_dir(root).prune(keep_last=1)
        where = f"{err} at prune call {n} ({fault.fired})"
        assert fault.fired is not None, f"the fault at prune call {n} did not fire"
        assert fault.fired.index == n, where
        assert info.value is fault.error, where
        holds = check_root(root, SEED, plan, 3, window=True)
        assert holds[3] == 2, f"{where}: the latest checkpoint is gone"
        locks = [name for name in leftovers(root) if name.endswith(".lock")]
        assert locks == [], f"{where}: prune left lock files {locks}"
        new_dir(root).clean()
        assert leftovers(root) == [], f"{where}: clean() left {leftovers(root)}"
    STATS[f"faults injected: {errno.errorcode[err]} at every _fs call of a prune"] += len(
        hook.events
    )


# ------------------------------------------------------------------ a real full disk


def free_bytes(path: Path) -> int:
    os.sync()  # ext4 returns freed blocks to the free count when the journal commits
    st = os.statvfs(path)
    return st.f_bfree * st.f_frsize


def fill(path: Path, *, to_the_last_byte: bool) -> None:
    """Write ``path`` until the disk is full (ENOSPC raised, or swallowed at the last byte)."""
    chunk = 1 << 16
    with open(path, "wb", buffering=0) as f:
        while chunk:
            try:
                while True:
                    f.write(b"\xa5" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC or not to_the_last_byte:
                    raise
            chunk //= 4


@pytest.mark.root
@pytest.mark.parametrize("kind", ["tmpfs", "ext4"])
@pytest.mark.parametrize("who", ["save", "library"])
def test_full_disk_during_a_save(mounter: Mounter, kind: str, who: str) -> None:
    """ENOSPC in the save or in the library's write: raised, old intact, space given back."""
    m = mount_or_skip(mounter, kind, size_mb=2 if kind == "tmpfs" else 8)
    root = m.path / "ckpts"
    ckpts = new_dir(root)
    plan = plan_of([1, 2])
    commit_save(ckpts, SEED, plan[0], single=True)
    before = free_bytes(m.path)
    hook = FsHook()
    with (
        hook.installed(),
        pytest.raises(OSError, match="No space") as info,
        ckpts.commit(2) as staging,
    ):
        fill(staging / "huge.bin", to_the_last_byte=who == "library")
    assert info.value.errno == errno.ENOSPC, info.value
    if who == "library":
        failed = [(e.name, exc) for e, exc in hook.raised]
        assert failed, "the library's own write should have hit the full disk"
        assert all(getattr(exc, "errno", None) == errno.ENOSPC for _, exc in failed), failed
    assert check_root(root, SEED, plan, 1, single=True) == {1: 0}
    assert leftovers(root) == []
    assert ckpts.clean() == []
    assert abs(free_bytes(m.path) - before) <= 64 << 10, "the failed save's space was not freed"
    commit_save(ckpts, SEED, plan[1], single=True)
    assert check_root(root, SEED, plan, 2, single=True) == {1: 0, 2: 1}
    STATS[f"real full disk: ENOSPC in the {who}, survived on"] += 1


def test_a_lock_file_that_cannot_be_removed_never_masks_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO removing the staging lock file: the save's own error is raised, the lock is released."""
    prepared(tmp_path, (1,))
    real_unlink = os.unlink
    failed: list[str] = []

    def unlink(path: str | os.PathLike[str], *args: object, **kwargs: object) -> None:
        if str(path).endswith(".lock") and ".tmp-" in str(path):
            failed.append(str(path))
            raise OSError(errno.EIO, "Input/output error (injected)", str(path))
        real_unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(RuntimeError, match="the save failed") as info, new_dir(tmp_path).commit(2):
        raise RuntimeError("the save failed")
    assert len(failed) == 1, "the injected unlink failure did not fire"
    assert any("also failed" in note for note in getattr(info.value, "__notes__", []))
    monkeypatch.undo()
    # The lock was released despite the failure, so clean() can take it and remove it.
    assert [p.name for p in new_dir(tmp_path).clean()] == [Path(failed[0]).name]
    assert leftovers(tmp_path) == []
    assert check_root(tmp_path, SEED, plan_of([1, 2]), 1) == {1: 0}
    STATS["faults injected: EIO removing a staging lock file"] += 1
