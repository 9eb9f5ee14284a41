"""The audit5 attack's findings, on recorded traces written out by hand (each exact, and
fast): what a call that overlaps an fsync, an append flag or a durable-write flag does in
the model. The corpus (``corpus/audit5.*``) holds the same workloads run for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _audit_scripts import needs_strace

from atomic_ckpt.testing import audit
from atomic_ckpt.testing._states import _CrashModel
from atomic_ckpt.testing.audit import AuditError
from atomic_ckpt.testing.audit._strace import read_calls
from atomic_ckpt.testing.audit._trace import TraceRecorder


def _dump(data: bytes) -> str:
    return f" | 00000  {' '.join(f'{b:02x}' for b in data)}"


def replay(
    tmp_path: Path, lines: list[str], files: dict[str, bytes] | None = None
) -> tuple[TraceRecorder, _CrashModel]:
    """The trace ``lines`` ({root} for the audited directory) replayed on a root holding
    ``files`` (none: empty)."""
    root = tmp_path / "ckpts"
    root.mkdir(parents=True)
    for name, data in (files or {}).items():
        (root / name).write_bytes(data)
    trace = tmp_path / "trace"
    trace.write_text("\n".join(lines).format(root=root) + "\n")
    rec = TraceRecorder(root)
    rec.feed(read_calls(trace))
    return rec, _CrashModel(rec.ops, rec.inodes)


OPEN = '100 openat(-100<{root}>, "w", 0x41, 0644) = 3<{root}/w>'


def test_a_write_done_while_an_fsync_ran_is_not_covered_by_it(tmp_path: Path) -> None:
    """fsync makes durable what was written before it began: a write of another thread
    that completed while it ran may have missed it, so it stays unsynced (and the fsync
    still covers the writes before it, even those of the same run)."""
    rec, model = replay(
        tmp_path,
        [
            OPEN,
            '100 write(3<{root}/w>, ""..., 4) = 4',
            _dump(b"aaaa"),
            "101 fsync(3<{root}/w> <unfinished ...>",
            '100 write(3<{root}/w>, ""..., 4) = 4',
            _dump(b"bbbb"),
            "101 <... fsync resumed>) = 0",
        ],
    )
    kinds = [(op.kind, op.description) for op in rec.ops]
    assert [k for k, _ in kinds] == ["entry", "data", "data", "sync"], kinds
    assert "not covering #3" in kinds[3][1]
    assert model.covered(len(rec.ops)) == {1}  # the first write only
    assert model.uncovered(len(rec.ops)) == (0, 2)  # the name (no directory fsync), the tail


def test_a_write_done_before_the_fsync_began_is_covered(tmp_path: Path) -> None:
    """The same calls, the fsync begun after both writes: it covers them."""
    rec, model = replay(
        tmp_path,
        [
            OPEN,
            '100 write(3<{root}/w>, ""..., 4) = 4',
            _dump(b"aaaa"),
            '100 write(3<{root}/w>, ""..., 4) = 4',
            _dump(b"bbbb"),
            "101 fsync(3<{root}/w>) = 0",
        ],
    )
    assert [op.kind for op in rec.ops] == ["entry", "data", "sync"]
    assert model.covered(len(rec.ops)) == {1}


def test_a_rename_done_while_a_sync_ran_is_not_covered_by_it(tmp_path: Path) -> None:
    """sync() (and a directory's fsync) cover only the names made before they began."""
    rec, model = replay(
        tmp_path,
        [
            OPEN,
            "101 sync( <unfinished ...>",
            '100 rename("{root}/w", "{root}/v") = 0',
            "101 <... sync resumed>) = 0",
        ],
    )
    assert [op.kind for op in rec.ops] == ["entry", "entry", "sync"]
    assert model.covered(len(rec.ops)) == {0}
    assert model.uncovered(len(rec.ops)) == (1,)


def _contents(rec: TraceRecorder) -> bytes:
    (inode,) = [i for i, n in enumerate(rec.inodes) if n.kind == "file"]
    return bytes(rec.content[inode])


def test_fcntl_setfl_o_append_makes_writes_append(tmp_path: Path) -> None:
    """F_SETFL O_APPEND: the next write lands at the end whatever the offset; F_SETFL
    without it: at the offset again."""
    rec, _ = replay(
        tmp_path,
        [
            OPEN,
            '100 write(3<{root}/w>, ""..., 2) = 2',
            _dump(b"aa"),
            "100 fcntl(3<{root}/w>, 0x4, 0x400) = 0",
            "100 lseek(3<{root}/w>, 0, 0) = 0",
            '100 write(3<{root}/w>, ""..., 2) = 2',
            _dump(b"bb"),
            "100 fcntl(3<{root}/w>, 0x4, 0) = 0",
            "100 lseek(3<{root}/w>, 0, 0) = 0",
            '100 write(3<{root}/w>, ""..., 1) = 1',
            _dump(b"c"),
        ],
    )
    assert _contents(rec) == b"cabb"
    assert rec.refusals == []


def test_pwritev2_flags(tmp_path: Path) -> None:
    """RWF_APPEND appends (the file offset unmoved by a positional write), RWF_NOAPPEND
    writes at the offset on an O_APPEND descriptor, RWF_DSYNC makes the write durable, an
    unknown flag is refused."""
    rec, model = replay(
        tmp_path,
        [
            '100 openat(-100<{root}>, "w", 0x441, 0644) = 3<{root}/w>',  # O_APPEND
            '100 write(3<{root}/w>, ""..., 2) = 2',
            _dump(b"aa"),
            "100 pwritev2(3<{root}/w>, [...], 1, 0, 0x20) = 1",  # RWF_NOAPPEND: at 0
            _dump(b"b"),
            '100 openat(-100<{root}>, "w", 0x1) = 4<{root}/w>',
            "100 pwritev2(4<{root}/w>, [...], 1, 0, 0x10) = 1",  # RWF_APPEND: at 2
            _dump(b"c"),
            "100 fsync(4<{root}/w>) = 0",
            '100 write(4<{root}/w>, ""..., 1) = 1',  # the offset is still 0
            _dump(b"d"),
            "100 fsync(4<{root}/w>) = 0",
            "100 pwritev2(4<{root}/w>, [...], 1, 3, 0x2) = 1",  # RWF_DSYNC
            _dump(b"e"),
        ],
    )
    assert _contents(rec) == b"dace"
    assert rec.refusals == []
    assert model.uncovered(len(rec.ops)) == (0,)  # only the name: the last write durable
    rec, _ = replay(tmp_path / "x", [OPEN, "100 pwritev2(3<{root}/w>, [...], 1, 0, 0x100) = 1"])
    assert [why for _, why in rec.refusals] == [
        "cannot rebuild: pwritev2 (trace line 2): pwritev2 flags 0x100"
    ]


def test_unshare_gives_the_thread_its_own_table(tmp_path: Path) -> None:
    """After unshare(CLONE_FILES) a thread's close and reopen of a number leave the other
    threads' descriptor as it was: their fsync is of their own file."""
    rec, _ = replay(
        tmp_path,
        [
            OPEN,
            '100 write(3<{root}/w>, ""..., 1) = 1',
            _dump(b"a"),
            "100 clone3({{flags=0x3d0f00, exit_signal=0}}, 88) = 101",
            "101 unshare(0x400) = 0",
            "101 close(3<{root}/w>) = 0",
            '101 openat(-100<{root}>, "v", 0x41, 0644) = 3<{root}/v>',
            "100 fsync(3<{root}/w>) = 0",
        ],
    )
    synced = [op for op in rec.ops if op.kind == "sync"]
    assert [op.description for op in synced] == ["fsync w"]


def test_a_socket_bound_in_the_tree_is_refused(tmp_path: Path) -> None:
    """bind() makes a socket node: refused in the tree, not elsewhere nor abstract."""
    bind = "100 bind(4<UNIX-STREAM:[1]>, {{sa_family=0x1, sun_path=PATH}}, 7) = 0"
    rec, _ = replay(tmp_path, [bind.replace("PATH", '"{root}/s"')])
    assert [p for p, _ in rec.refusals] == ["s"]
    for n, path in enumerate(('"/tmp/elsewhere.sock"', '@"abstract"')):
        rec, _ = replay(tmp_path / str(n), [bind.replace("PATH", path)])
        assert rec.refusals == []


def test_chroot_and_mounts_are_refused_wherever_they_point(tmp_path: Path) -> None:
    """A chroot, a mount or setns changes what every later path means: refused."""
    for n, line in enumerate(
        ('100 chroot("/elsewhere") = 0', '100 mount("/a", "/b", NULL, 0x1000, NULL) = 0')
    ):
        rec, _ = replay(tmp_path / str(n), [line])
        assert len(rec.refusals) == 1, line


def test_a_rename_of_a_parent_of_the_root_is_refused(tmp_path: Path) -> None:
    """Renaming a directory above the audited one takes it along: refused."""
    rec, _ = replay(tmp_path, ['100 rename("{root}/..", "/tmp/gone") = 0'])
    assert ["directory above the audited one" in why for _, why in rec.refusals] == [True]
    rec, _ = replay(tmp_path / "x", ['100 rename("{root}x", "/tmp/gone") = 0'])  # a sibling
    assert rec.refusals == []


def test_a_zero_filled_append_keeps_the_bytes_fsynced_before_it(tmp_path: Path) -> None:
    """An unsynced append zero-filled by a power loss (ext4's delayed allocation: the size
    reached the disk, the block did not) reads as zeros over its own range only: the
    record fsynced before it stays (an append-only log was judged broken)."""
    rec, model = replay(
        tmp_path,
        [
            '100 openat(-100<{root}>, "w", 0x441, 0644) = 3<{root}/w>',
            '100 write(3<{root}/w>, ""..., 2) = 2',
            _dump(b"aa"),
            "100 fsync(3<{root}/w>) = 0",
            '100 write(3<{root}/w>, ""..., 2) = 2',
            _dump(b"bb"),
        ],
    )
    assert [op.kind for op in rec.ops] == ["entry", "data", "sync", "data"]
    flat = model._build({0, 1, 3}, {3: "zero"})
    assert [(p, bytes(d)) for p, kind, d in flat if kind == "file"] == [("w", b"aa\0\0")]


def test_an_fsync_through_a_descriptor_whose_name_is_gone_counts(tmp_path: Path) -> None:
    """strace decorates a descriptor whose name was removed ``3</p/w>(deleted)``: the call
    is still the descriptor's (its fsync was dropped: a save giving its file a second name,
    removing the first, then fsyncing was judged broken)."""
    rec, model = replay(
        tmp_path,
        [
            OPEN,
            '100 write(3<{root}/w>, ""..., 1) = 1',
            _dump(b"a"),
            '100 link("{root}/w", "{root}/v") = 0',
            '100 unlink("{root}/w") = 0',
            "100 fsync(3<{root}/w>(deleted)) = 0",
        ],
    )
    assert [op.kind for op in rec.ops] == ["entry", "data", "entry", "entry", "sync"]
    assert model.covered(len(rec.ops)) == {1}


def test_o_tmpfile_named_by_linkat(tmp_path: Path) -> None:
    """An O_TMPFILE file is in no directory until linkat names it, by AT_EMPTY_PATH or by
    /proc/self/fd/N with AT_SYMLINK_FOLLOW (it was refused as a file from outside)."""
    for n, link in enumerate(
        (
            '100 linkat(3<{root}/#12>(deleted), "", -100<{root}>, "{root}/w", 0x1000) = 0',
            '100 linkat(-100<{root}>, "/proc/self/fd/3", -100<{root}>, "{root}/w", 0x400) = 0',
        )
    ):
        rec, model = replay(
            tmp_path / str(n),
            [
                '100 openat(-100<{root}>, "{root}", 0x410001, 0644) = 3<{root}/#12>(deleted)',
                '100 write(3<{root}/#12>(deleted), ""..., 2) = 2',
                _dump(b"ab"),
                "100 fsync(3<{root}/#12>(deleted)) = 0",
                link,
            ],
        )
        assert rec.refusals == [], link
        assert [op.kind for op in rec.ops] == ["data", "sync", "entry"], link
        assert model._build({0, 2}, {}) == (("w", "file", b"ab"),)


@needs_strace
def test_a_check_command_that_cannot_run_is_refused(tmp_path: Path) -> None:
    """A check command that does not exist (the shell's exit 127) says nothing about
    crashes: the audit refuses (exit 2, AuditError) instead of reporting every crash state
    as a violation (exit 1)."""
    workload = [sys.executable, "-c", "import os; os.makedirs('ckpts'); open('ckpts/w', 'w')"]
    with pytest.raises(AuditError, match=r"the check command could not run \(exit 127"):
        audit(workload, "no-such-command-audit5", root="ckpts", cwd=tmp_path)
    assert not (tmp_path / "ckpts").exists()  # the directory put back as it was: absent


def test_a_write_in_progress_at_a_crash_may_be_done_or_half_done(tmp_path: Path) -> None:
    """A write that began before another thread's rename completed, and ended after it: a
    crash before the rename may find the write done or half done (the kill states had it
    only after the rename, so DONE never stood beside a changed w)."""
    rec, model = replay(
        tmp_path,
        [
            '100 openat(-100<{root}>, "w", 0x1) = 3<{root}/w>',
            '100 write(3<{root}/w>, ""..., 4 <unfinished ...>',
            '101 rename("{root}/DONE", "{root}/DONE.old") = 0',
            "100 <... write resumed>) = 4",
            _dump(b"nnnn"),
        ],
        files={"w": b"oooo", "DONE": b""},
    )
    assert [op.kind for op in rec.ops] == ["entry", "data"]
    assert rec.ops[1].began == 0
    kill = [c for c in model.candidates(("kill",)) if c.crash_point == 0]
    seen = {model._build(c.persisted, c.fates, c.writes) for c in kill}
    assert (("DONE", "file", b""), ("w", "file", b"nnnn")) in seen
    assert (("DONE", "file", b""), ("w", "file", b"nnoo")) in seen
    power = [c for c in model.candidates(("power",)) if c.crash_point == 0]
    shown = {model._build(c.persisted, c.fates, c.writes) for c in power}
    # the write in flight reaches w (whole or in part) while DONE still stands beside it
    changed = {dict((n, d) for n, _, d in s)["w"] for s in shown if ("DONE", "file", b"") in s}
    assert changed - {b"oooo"}, f"power at 0 never shows DONE beside a changed w: {shown}"
