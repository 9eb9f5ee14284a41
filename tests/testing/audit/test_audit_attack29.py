"""Issue 29's last outside attacks: an ioctl that changes a file (a reflink), a descriptor
received over a Unix socket (SCM_RIGHTS) and an execve from a thread other than the
leader; and the calls of the same class the allow-list now traces (Linux AIO, acct,
swapon, pidfd_getfd, copy_file_range to an offset, fallocate's other modes).

The trace lines are strace's own (6.1, ``-yy -X raw -s 0``); the FICLONE one was taken
from a run on a loop-mounted XFS, where the reflink succeeds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from _audit_scripts import needs_strace

from atomic_ckpt.testing._sparse import freeze
from atomic_ckpt.testing.audit._strace import read_calls, record_command, split_args
from atomic_ckpt.testing.audit._syscalls import REFUSED, TABLE, TRACED, WORKLOAD_WIDE
from atomic_ckpt.testing.audit._trace import TraceRecorder

pytestmark = needs_strace


def replay(
    tmp_path: Path, lines: list[str], files: dict[str, bytes] | None = None
) -> TraceRecorder:
    """The trace ``lines`` ({root}: the audited directory) replayed on a root holding
    ``files``."""
    root = tmp_path / "ckpts"
    root.mkdir(parents=True)
    for name, data in (files or {}).items():
        (root / name).write_bytes(data)
    trace = tmp_path / "trace"
    trace.write_text("\n".join(lines).format(root=root) + "\n")
    rec = TraceRecorder(root)
    rec.feed(read_calls(trace))
    return rec


def refused(rec: TraceRecorder) -> list[str]:
    return [path for path, _ in rec.refusals]


def synced(rec: TraceRecorder) -> list[str]:
    return [op.description for op in rec.ops if op.kind == "sync"]


OPEN_W = '100 openat(-100<{root}>, "w", 0x2) = 4<{root}/w>'  # O_RDWR, inheritable


# ---- 1. ioctl


@pytest.mark.parametrize(
    "line",
    [
        "100 ioctl(4<{root}/w>, 0x40049409, 3) = 0",  # FICLONE (XFS, from outside)
        "100 ioctl(4<{root}/w>, 0x4020940d, {{src_fd=3, src_offset=0, src_length=4096,"
        " dest_offset=0}}) = 0",  # FICLONERANGE
        "100 ioctl(4<{root}/w>, 0xc0189436, {{src_offset=0, src_length=4096}}) = 0",
        "100 ioctl(4<{root}/w>, 0x40086602, [0x80000]) = 0",  # FS_IOC_SETFLAGS (chattr)
        "100 ioctl(4<{root}/w>, 0xc0ffee, 0x7ffd0) = 0",  # anything else
    ],
)
def test_an_ioctl_that_may_change_a_file_in_the_tree_is_refused(tmp_path: Path, line: str) -> None:
    """A reflink makes the file's bytes another file's with no write in the trace: main
    did not even trace ioctl, and called such a save clean. Refused, saying what to do."""
    rec = replay(tmp_path, [OPEN_W, line], {"w": b"GOOD" * 1024})
    assert refused(rec) == ["w"]
    why = rec.refusals[0][1]
    assert why.startswith("cannot rebuild: ioctl (trace line 2): ioctl ")
    assert "write the bytes" in why
    if "0x40049409" in line:
        assert "FICLONE (a reflink" in why


def test_an_ioctl_that_changes_no_file_or_fails_or_reaches_outside_is_not_refused(
    tmp_path: Path,
) -> None:
    """Python's isatty (TCGETS, failing), a failed FICLONE (cp --reflink=auto on ext4),
    FS_IOC_GETFLAGS, a clone *out of* the tree and a GPU driver's ioctl change nothing
    in it."""
    rec = replay(
        tmp_path,
        [
            OPEN_W,
            "100 ioctl(4<{root}/w>, 0x5401, 0x7ffc) = -1 ENOTTY (Inappropriate ioctl for device)",
            "100 ioctl(4<{root}/w>, 0x40049409, 3) = -1 EOPNOTSUPP (Operation not supported)",
            "100 ioctl(4<{root}/w>, 0x80086601, [0x80000]) = 0",
            "100 ioctl(4<{root}/w>, 0xc020660b, {{fm_start=0}}) = 0",  # FIEMAP
            "100 ioctl(5</elsewhere/copy>, 0x40049409, 4) = 0",
            "100 ioctl(6</dev/nvidiactl>, 0xc020462a, 0x7ffd0) = 0",
        ],
        {"w": b"GOOD"},
    )
    assert rec.refusals == []


def test_fioclex_and_fionclex_mark_close_on_exec(tmp_path: Path) -> None:
    """Python marks descriptors close-on-exec with ioctl(FIOCLEX): the execve drops them."""
    rec = replay(
        tmp_path,
        [
            OPEN_W,
            '100 openat(-100<{root}>, "v", 0x80042, 0644) = 5<{root}/v>',  # O_CLOEXEC
            "100 ioctl(4<{root}/w>, 0x5451) = 0",  # FIOCLEX
            "100 ioctl(5<{root}/v>, 0x5450) = 0",  # FIONCLEX
            '100 execve("/bin/true", [...], 0x7ffd /* 3 vars */) = 0',
        ],
    )
    assert sorted(rec.tables[100]) == [5]


def test_the_recorder_traces_ioctl_and_shows_the_descriptors_a_message_carries(
    tmp_path: Path,
) -> None:
    """The recording itself: ioctl is traced, and recvmsg shows the SCM_RIGHTS
    descriptors with their paths (strace abbreviates them to ``[...]`` otherwise)."""
    root = tmp_path / "ckpts"
    root.mkdir()
    (tmp_path / "w.py").write_text(
        "import array, fcntl, os, socket, sys\n"
        "fd = os.open(os.path.join(sys.argv[1], 'w'), os.O_WRONLY | os.O_CREAT, 0o644)\n"
        "fcntl.ioctl(fd, 0x80086601, array.array('l', [0]), True)\n"  # FS_IOC_GETFLAGS
        "a, b = socket.socketpair()\n"
        "socket.send_fds(a, [b'x'], [fd])\n"
        "socket.recv_fds(b, 1, 1)\n"
    )
    trace = tmp_path / "trace"
    status = record_command([sys.executable, str(tmp_path / "w.py"), str(root)], trace)
    assert status == 0
    calls = [c for c in read_calls(trace) if c.name in ("ioctl", "recvmsg") and c.ret is not None]
    assert any(c.name == "ioctl" and c.args[0].endswith(f"<{root}/w>") for c in calls)
    received = [c for c in calls if c.name == "recvmsg"]
    assert received
    assert "cmsg_data=[" in received[0].args[1]
    assert f"<{root}/w>]" in received[0].args[1]


# ---- 2. SCM_RIGHTS

RECV = (
    "100 recvmsg(3<UNIX-STREAM:[34684->34685]>, {{msg_name=0x7ffe, msg_namelen=110 => 0,"
    ' msg_iov=[{{iov_base=""..., iov_len=1}}], msg_iovlen=1, msg_control=[{{cmsg_len=20,'
    " cmsg_level=0x1, cmsg_type=TYPE, cmsg_data=[DATA]}}], msg_controllen=20,"
    " msg_flags=0}}, 0) = 1"
)


def test_a_descriptor_of_the_tree_received_over_a_unix_socket_is_refused(tmp_path: Path) -> None:
    """It shares the sender's open file (offset, O_APPEND, O_SYNC), which the receiver's
    table never saw opened: main placed it by path at a guessed offset and called an
    in-place overwrite through it clean (corpus attack29.2)."""
    line = RECV.replace("TYPE", "0x1").replace("DATA", "7</elsewhere/x>, 5<{root}/w>")
    rec = replay(tmp_path, [line], {"w": b"GOOD"})
    assert refused(rec) == ["w"]
    assert "SCM_RIGHTS" in rec.refusals[0][1]
    assert "open the file by name" in rec.refusals[0][1]


def test_descriptors_received_from_outside_the_tree_are_not_refused(tmp_path: Path) -> None:
    """A DataLoader's shared-memory descriptors, credentials: nothing in the tree."""
    for n, (kind, data) in enumerate(
        [("0x1", "5</dev/shm/torch_1>, 6<anon_inode:[eventfd]>"), ("0x2", "{{pid=1, uid=0}}")]
    ):
        rec = replay(tmp_path / str(n), [RECV.replace("TYPE", kind).replace("DATA", data)])
        assert rec.refusals == []


def test_a_socket_pair_descriptor_does_not_cut_the_call_short() -> None:
    """strace decorates a socketpair's descriptor ``UNIX-STREAM:[1->2]``: its '>' is not
    the decoration's end (main lost every such call's arguments and return value)."""
    args, rest = split_args("3<UNIX-STREAM:[1->2]>, 5</a/b:[x>, 0) = 1")
    assert args == ["3<UNIX-STREAM:[1->2]>", "5</a/b:[x>", "0"]
    assert rest == " = 1"


# ---- 3. execve from a thread other than the leader

BEFORE_EXEC = [
    '100 openat(-100<{root}>, "a", 0x41, 0644) = 3<{root}/a>',
    '100 write(3<{root}/a>, ""..., 1) = 1',
    " | 00000  61                                                a                |",
    "100 clone3({{flags=0x3d0f00, exit_signal=0}}, 88) = 101",
    "101 unshare(0x400) = 0",
    "101 close(3<{root}/a>) = 0",
    '101 openat(-100<{root}>, "b", 0x41, 0644) = 3<{root}/b>',
    '101 openat(-100<{root}>, "c", 0x80041, 0644) = 4<{root}/c>',  # O_CLOEXEC
    '100 read(7</elsewhere/x>, ""..., 10 <unfinished ...>',  # the leader, blocked
]


@pytest.mark.parametrize(
    "exec_lines",
    [
        [  # strace 6: the thread's execve completes as the leader's pid
            '101 execve("/usr/bin/python3", [...], 0x7ffd /* 35 vars */ <pid changed to 100 ...>',
            "100 +++ superseded by execve in pid 101 +++",
            "100 <... execve resumed>)             = -1 (errno 18446744073709551359)",
        ],
        [  # older strace: left unfinished, resumed under the leader's pid
            '101 execve("/usr/bin/python3", [...], 0x7ffd /* 35 vars */ <unfinished ...>',
            "100 +++ superseded by execve in thread 101 +++",
            "100 <... execve resumed>) = 0",
        ],
    ],
    ids=["pid-changed", "superseded"],
)
def test_an_execve_from_a_thread_keeps_that_threads_table(
    tmp_path: Path, exec_lines: list[str]
) -> None:
    """The exec'ing thread becomes the leader: the new program's descriptor 3 is the
    thread's (b), not the leader's (a), and its close-on-exec descriptor is gone. Main
    dropped the execve and took fsync(3) for a sync of a (corpus attack29.3)."""
    rec = replay(tmp_path, [*BEFORE_EXEC, *exec_lines, "100 fsync(3<{root}/b>) = 0"])
    assert synced(rec) == ["fsync b"]
    assert sorted(rec.tables[100]) == [3]
    assert 101 not in rec.tables
    assert rec.refusals == []
    # the leader's unfinished read never returned: nothing was glued to the execve
    assert freeze(rec.content[rec.inodes[0].entries["a"]]) == b"a"


# ---- the same class: calls that can change a file, a name or durability


def test_the_allow_list_traces_every_call_of_the_class() -> None:
    """Each call that can change a file's bytes, a name or durability, or hand over a
    descriptor, is in the table (so traced), modelled or refused; main traced none of
    these."""
    for name in ("ioctl", "recvmsg", "recvmmsg", "pidfd_getfd", "io_submit", "acct", "swapon"):
        assert name in TRACED.split(","), name
    assert TABLE["io_submit"][0] == REFUSED
    assert "io_submit" in WORKLOAD_WIDE


@pytest.mark.parametrize(
    ("line", "paths"),
    [
        ("100 io_submit(0x7f12, 1, [0x5580]) = 1", ["io_submit"]),  # anywhere: iocbs unseen
        ('100 acct("{root}/log") = 0', ["log"]),
        ('100 acct("/var/log/account/pacct") = 0', []),
        ('100 swapon("{root}/swap", 0) = 0', ["swap"]),
        ("100 pidfd_getfd(5<anon_inode:[pidfd]>, 4, 0) = 6<{root}/w>", ["w"]),
        ("100 pidfd_getfd(5<anon_inode:[pidfd]>, 4, 0) = 6</elsewhere/x>", []),
        (
            "100 open_by_handle_at(3</>, {{handle_bytes=8, handle_type=0x1}}, 0x2) = 5<{root}/w>",
            ["w"],
        ),
        ('100 name_to_handle_at(-100</>, "{root}/w", {{handle_bytes=8}}, [1], 0) = 0', []),
        ("100 fallocate(4<{root}/w>, 0x8, 0, 4096) = 0", ["w"]),  # COLLAPSE_RANGE
        ("100 fallocate(4<{root}/w>, 0x20, 0, 4096) = 0", ["w"]),  # INSERT_RANGE
        ("100 fallocate(4<{root}/w>, 0x40, 0, 4096) = 0", ["w"]),  # UNSHARE_RANGE
        ("100 splice(7<pipe:[1]>, NULL, 4<{root}/w>, [0], 4, 0) = 4", ["w"]),
        ("100 copy_file_range(7</elsewhere/x>, NULL, 4<{root}/w>, 0x7ffd, 4, 0) = 4", ["w"]),
    ],
)
def test_a_call_of_the_class_on_the_tree_is_refused(
    tmp_path: Path, line: str, paths: list[str]
) -> None:
    """Refused when it reaches the tree (io_submit wherever it points), never dropped."""
    rec = replay(tmp_path, [OPEN_W, line], {"w": b"GOOD" * 1024})
    assert refused(rec) == paths, rec.refusals


def test_copy_file_range_to_an_explicit_offset_is_a_write_there(tmp_path: Path) -> None:
    """``copy_file_range(s, [1], d, [5], 3)`` writes s[1:4] at d[5:8], d's offset unmoved
    (main refused it)."""
    rec = replay(
        tmp_path,
        [
            '100 openat(-100<{root}>, "s", 0x0) = 3<{root}/s>',
            OPEN_W,
            "100 copy_file_range(3<{root}/s>, [1], 4<{root}/w>, [5], 3, 0) = 3",
            '100 write(4<{root}/w>, ""..., 1) = 1',
            " | 00000  5a                                                Z                |",
        ],
        {"s": b"abcdef", "w": b"0123456789"},
    )
    assert rec.refusals == []
    rec._flush()
    assert freeze(rec.content[rec.inodes[0].entries["w"]]) == b"Z1234bcd89"


@pytest.mark.parametrize(
    ("mode", "after"),
    [("0x3", b"01\0\0\x0056789"), ("0x10", b"01\0\0\x0056789"), ("0x11", b"01\0\0\x0056789")],
    ids=["punch-hole", "zero-range", "zero-range-keep-size"],
)
def test_fallocate_punch_and_zero_are_modelled(tmp_path: Path, mode: str, after: bytes) -> None:
    """PUNCH_HOLE|KEEP_SIZE and ZERO_RANGE zero the range (as each crash state has it)."""
    rec = replay(
        tmp_path,
        [OPEN_W, f"100 fallocate(4<{{root}}/w>, {mode}, 2, 3) = 0"],
        {"w": b"0123456789"},
    )
    assert rec.refusals == []
    rec._flush()
    assert freeze(rec.content[rec.inodes[0].entries["w"]]) == after


@pytest.mark.parametrize(
    "lines",
    [
        [  # killed inside a write (strace: "= ?"): 24 MiB of 512 were on disk
            '101 write(4<{root}/w>, ""..., 536870912) = ?',
            "101 +++ killed by SIGKILL +++",
        ],
        [  # ended inside a write by another thread's execve
            '100 write(4<{root}/w>, ""..., 536870912 <unfinished ...>',
            '101 execve("/bin/true", [...], 0x7ffd /* 3 vars */ <pid changed to 100 ...>',
            "100 +++ superseded by execve in pid 101 +++",
            "100 <... execve resumed>) = 0",
        ],
    ],
    ids=["killed", "superseded"],
)
def test_a_change_that_never_returned_is_refused(tmp_path: Path, lines: list[str]) -> None:
    """Its process was ended inside it: some of its bytes may be on disk (the kernel
    stops a write at a fatal signal, keeping what it copied). Main dropped it, so a later
    rewrite hid the partial bytes from every crash state."""
    rec = replay(tmp_path, [OPEN_W, *lines, "100 ftruncate(4<{root}/w>, 0) = 0"], {"w": b""})
    assert refused(rec) == ["w"]
    assert "never returned" in rec.refusals[0][1]


def test_a_sync_or_a_read_that_never_returned_is_not_refused(tmp_path: Path) -> None:
    """An fsync that never returned is taken as not made (the pessimistic side); a read
    changes nothing."""
    rec = replay(
        tmp_path,
        [OPEN_W, "101 fsync(4<{root}/w>) = ?", '101 read(4<{root}/w>, ""..., 10) = ?'],
        {"w": b"GOOD"},
    )
    assert rec.refusals == []
    assert synced(rec) == []


def test_close_range_unshare_closes_only_the_calling_threads_copy(tmp_path: Path) -> None:
    """close_range(CLOSE_RANGE_UNSHARE) unshares the table first: another thread's
    descriptor stays open, and its fsync is of its own file (main closed it for every
    thread, and placed the fsync by path)."""
    rec = replay(
        tmp_path,
        [
            OPEN_W,
            "100 clone3({{flags=0x3d0f00, exit_signal=0}}, 88) = 101",
            "101 close_range(3, 4294967295, 0x2) = 0",
            '101 openat(-100<{root}>, "v", 0x41, 0644) = 4<{root}/v>',
            "100 lseek(4<{root}/w>, 2, 0) = 2",
            "100 ioctl(4<{root}/w>, 0x5451) = 0",  # FIOCLEX on the leader's own
        ],
        {"w": b"GOOD"},
    )
    assert rec.tables[100][4].path == "w"
    assert rec.tables[100][4].pos == 2
    assert sorted(rec.tables[101]) == [4]
    assert rec.tables[101][4].path == "v"
    assert 4 in rec.tables[100].cloexec
    assert 4 not in rec.tables[101].cloexec
