"""Reading an strace trace: calls yielded when they complete, written bytes from the hex
dump, decorated descriptors, failed calls without a return value."""

from __future__ import annotations

from pathlib import Path

from atomic_ckpt.testing.audit._strace import fd_arg, read_calls, split_args, unescape

TRACE = """\
100   openat(-100</work>, "ckpts/a b\\"c", 0x241, 0666) = 3</work/ckpts/a b"c>
100   write(3</work/ckpts/a b"c>, ""..., 20 <unfinished ...>
101   fsync(3</work/ckpts/a b"c> <unfinished ...>
100   <... write resumed>) = 20
 | 00000  68 65 6c 6c 6f 20 77 6f  72 6c 64 20 66 72 6f 6d  hello world from |
 | 00010  20 6f 6e 65                                       one              |
101   <... fsync resumed>) = 0
100   openat(-100</work>, "missing", 0) = -1 ENOENT (No such file or directory)
100   mmap(NULL, 4096, 0x3, 0x1, 4</work/ckpts/m>, 0) = 0x7f1032f0d000
100   clone3({flags=0x3d0f00, child_tid=0x7f8d533b1990} => {parent_tid=[4889]}, 88) = 4889
100   write(5</dev/null<char 1:3>>, ""..., 2) = 2
 | 00000  6f 6b                                             ok               |
"""


def test_calls_come_in_completion_order_with_their_bytes(tmp_path: Path) -> None:
    """An interrupted write is yielded when it resumes, with the bytes of its dump lines."""
    trace = tmp_path / "trace"
    trace.write_text(TRACE)
    calls = list(read_calls(trace))
    assert [(c.tid, c.name) for c in calls] == [
        (100, "openat"),
        (100, "write"),
        (101, "fsync"),
        (100, "openat"),
        (100, "mmap"),
        (100, "clone3"),
        (100, "write"),
    ]
    opened, write, fsync, missing, mmap, clone, devnull = calls
    assert opened.ret == 3
    assert opened.ret_path == '/work/ckpts/a b"c'
    assert unescape(opened.args[1]) == 'ckpts/a b"c'
    assert bytes(write.data) == b"hello world from one"
    assert write.ret == 20
    assert fsync.ret == 0
    assert missing.ret is None  # failed: changes nothing
    assert mmap.ret == 0x7F1032F0D000
    assert clone.ret == 4889
    assert bytes(devnull.data) == b"ok"
    assert fd_arg(devnull.args[0]) == (5, "/dev/null<char 1:3>")


def test_arguments_split_at_top_level_commas_only() -> None:
    """Commas inside strings, braces and decorations do not split arguments."""
    args, rest = split_args('3</a,b>, "x,y", {flags=0x1, mode=0}, [1, 2]) = 0')
    assert args == ["3</a,b>", '"x,y"', "{flags=0x1, mode=0}", "[1, 2]"]
    assert rest == " = 0"
    assert fd_arg("-100</home/user>") == (-100, "/home/user")
    assert unescape('"\\x00\\n\\\\ok"...') == "\x00\n\\ok"
