"""Issue 29.4 and the review's "decide and document" items, on the replay alone (no
strace): a shared mapping through a writable descriptor is refused; paths spelled through
an alias of the tree are refused; close-on-exec descriptors leave the table at execve; a
descriptor number the trace saw reused (pipe, socket) no longer names a file in the tree."""

from __future__ import annotations

import os
from pathlib import Path

from atomic_ckpt.testing.audit._strace import Call
from atomic_ckpt.testing.audit._trace import TraceRecorder, in_canonical_order


def _open(root: Path, fd: int, name: str, flags: int, tid: int = 1) -> Call:
    return Call(tid, "openat", [f"-100<{root.parent}>", f'"{root}/{name}"', str(flags)], fd,
                ret_path=f"{root}/{name}")  # fmt: skip


def _mmap(root: Path, fd: int, name: str, prot: int, flags: int) -> Call:
    return Call(1, "mmap", ["NULL", "4096", hex(prot), hex(flags), f"{fd}<{root}/{name}>", "0"],
                0x7F0000000000, line=9)  # fmt: skip


def test_a_shared_mapping_through_a_writable_descriptor_is_refused(tmp_path: Path) -> None:
    """29.4: stores through a shared mapping are no system call; msync flushes only what was
    stored before it. Shared + a descriptor open for writing: refused at the mmap, even
    PROT_READ (mprotect, untraced, can add PROT_WRITE). Read-only or private: allowed."""
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "m.bin").write_bytes(bytes(4096))
    cases = {
        (os.O_RDWR, 0x3, 0x1): True,  # the usual numpy.memmap / mmap.mmap(fd, n)
        (os.O_RDWR, 0x1, 0x1): True,  # PROT_READ, but mprotect could make it writable
        (os.O_RDWR, 0x3, 0x3): True,  # MAP_SHARED_VALIDATE
        (os.O_RDWR, 0x3, 0x2): False,  # MAP_PRIVATE: stores never reach the file
        (os.O_RDONLY, 0x1, 0x1): False,  # safetensors' safe_open, the library's checksums
    }
    for (access, prot, flags), refused in cases.items():
        rec = TraceRecorder(root)
        rec.feed([_open(root, 3, "m.bin", access), _mmap(root, 3, "m.bin", prot, flags)])
        said = [why for _, why in rec.refusals]
        assert bool(said) == refused, (access, prot, flags, said)
        assert all("mapped shared through a descriptor open for writing" in w for w in said)


def test_a_path_through_proc_self_cwd_is_refused(tmp_path: Path) -> None:
    """/proc/self/cwd/... (and /proc/PID/fd/N/...) is resolved by the kernel against the
    process: the recorder cannot place it, so a change made through it is refused."""
    root = tmp_path / "ckpts"
    root.mkdir()
    for path in ("/proc/self/cwd/ckpts/x", "/proc/1234/fd/5/x", "/proc/thread-self/root/x"):
        rec = TraceRecorder(root)
        rec.feed([Call(1, "unlink", [f'"{path}"'], 0, line=3)])
        assert [p for p, _ in rec.refusals] == [path], path
        assert "alias of the audited tree" in rec.refusals[0][1]
    rec = TraceRecorder(root)  # reading /proc is not a change: nothing refused
    rec.feed([Call(1, "unlink", [f'"{tmp_path}/elsewhere"'], 0)])
    assert rec.refusals == []


def test_a_path_through_an_outside_symlink_into_the_tree_is_refused(tmp_path: Path) -> None:
    """A symlink outside the tree pointing into it: a rename spelled through it changes the
    tree, unseen by the spelling; the recorder resolves the directory and refuses."""
    root = tmp_path / "ckpts"
    (root / "1").mkdir(parents=True)
    (root / "1" / "w.bin").write_bytes(b"w")
    (tmp_path / "alias").symlink_to(root)
    rec = TraceRecorder(root)
    rec.feed([Call(1, "rename", [f'"{tmp_path}/alias/1"', f'"{tmp_path}/alias/2"'], 0)])
    assert sorted(p for p, _ in rec.refusals) == [f"{tmp_path}/alias/1", f"{tmp_path}/alias/2"]


def test_close_on_exec_descriptors_leave_the_table_at_execve(tmp_path: Path) -> None:
    """O_CLOEXEC, dup3(O_CLOEXEC), F_DUPFD_CLOEXEC, F_SETFD and close_range's
    CLOSE_RANGE_CLOEXEC mark a descriptor; a successful execve drops the marked ones."""
    root = tmp_path / "ckpts"
    root.mkdir()
    w = os.O_WRONLY | os.O_CREAT
    d = f"3<{root}/a>"
    rec = TraceRecorder(root)
    rec.feed([
        _open(root, 3, "a", w | os.O_CLOEXEC),
        _open(root, 4, "b", w),
        Call(1, "dup3", ["4", "5", str(os.O_CLOEXEC)], 5),
        Call(1, "fcntl", [f"4<{root}/b>", "0x406", "10"], 10),  # F_DUPFD_CLOEXEC
        Call(1, "fcntl", [f"4<{root}/b>", "0", "11"], 11),  # F_DUPFD: inherited
        Call(1, "dup2", [d, "6"], 6),  # dup2: the new one inherited
        Call(1, "fcntl", ["6", "0x2", "0x1"], 0),  # F_SETFD FD_CLOEXEC
        Call(1, "dup", [d], 7),
        Call(1, "close_range", ["7", "7", "0x4"], 0),  # CLOSE_RANGE_CLOEXEC
        Call(1, "execve", ['"/bin/true"', "[]", "0x0"], 0),
    ])  # fmt: skip
    assert sorted(rec.tables[1]) == [4, 11]


def test_a_reused_descriptor_number_no_longer_names_a_tree_file(tmp_path: Path) -> None:
    """fd 3 names ckpts/a until a call the trace does not show (pipe) reuses the number:
    strace's decoration then says pipe, so the write goes nowhere in the model."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed([
        _open(root, 3, "a", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC),
        Call(1, "execve", ['"/bin/true"', "[]", "0x0"], 0),
        _open(root, 3, "b", os.O_WRONLY | os.O_CREAT),
        Call(1, "write", ["3<pipe:[99]>", "", "5"], 5, data=bytearray(b"hello")),
    ])  # fmt: skip
    assert [op.description for op in rec.ops if op.kind == "data"] == []
    assert 3 not in rec.tables[1]


def test_fsyncs_that_ran_at_once_are_replayed_in_one_order(tmp_path: Path) -> None:
    """Two threads' fsyncs that overlapped (each began before the other returned) come out
    ordered by path, whichever returned first: the same workload, the same operations.
    One that began after the other returned keeps its place (that order is known)."""
    a, b = "3</r/a.bin>", "4</r/b.bin>"
    first = [
        Call(2, "fsync", [b], 0, line=11, start=10),
        Call(1, "fsync", [a], 0, line=12, start=9),
    ]
    second = [
        Call(1, "fsync", [a], 0, line=11, start=9),
        Call(2, "fsync", [b], 0, line=12, start=10),
    ]
    for calls in (first, second):
        assert [c.args[0] for c in in_canonical_order(calls)] == [a, b]
    apart = [
        Call(2, "fsync", [b], 0, line=10, start=10),
        Call(1, "fsync", [a], 0, line=12, start=11),
    ]
    assert [c.args[0] for c in in_canonical_order(apart)] == [b, a]
    between = [first[0], Call(3, "write", ["5</r/c>"], 1, line=12, start=12), first[1]]
    assert [c.name for c in in_canonical_order(between)] == ["fsync", "write", "fsync"]
