"""Issue 29's modelling items: each workload a real crash breaks is found broken, or the
audit refuses it (exit 2), never called clean; and the allow-list is one table."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from _audit_scripts import needs_strace, script

from atomic_ckpt.testing import audit
from atomic_ckpt.testing.audit import CannotRebuild
from atomic_ckpt.testing.audit._materialize import Materializer
from atomic_ckpt.testing.audit._strace import Call
from atomic_ckpt.testing.audit._syscalls import IGNORED, MODELLED, TABLE, TRACED, guide_table
from atomic_ckpt.testing.audit._trace import TraceRecorder

pytestmark = needs_strace

GUIDE = Path(__file__).parents[3] / "docs" / "guides" / "audit.md"


def test_every_modelled_call_has_a_replay_and_every_replay_is_in_the_table() -> None:
    """The table is the allow-list: what it models has a handler, no handler is unlisted."""
    handlers = {n[5:] for n in dir(TraceRecorder) if n.startswith("_sys_")}
    modelled = {n for n, (how, _) in TABLE.items() if how == MODELLED}
    assert handlers == modelled
    assert TRACED.split(",") == list(TABLE)


def test_the_guide_prints_the_table() -> None:
    """docs/guides/audit.md holds the allow-list exactly as the code has it."""
    assert guide_table() in GUIDE.read_text()


@pytest.mark.parametrize("name", ["frobnicate", "mknodat", "splice", "setxattr"])
def test_a_call_outside_the_table_touching_the_root_is_refused(tmp_path: Path, name: str) -> None:
    """A call the table does not model (or refuses), naming a path under the root, is a
    refusal ("cannot rebuild: <call>"), not a silent drop; the same call elsewhere is not."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed([Call(1, name, ["AT_FDCWD", f'"{tmp_path}/elsewhere"'], 0)])
    assert rec.refusals == []
    rec = TraceRecorder(root)
    rec.feed([Call(1, name, [f"3<{root}/x>", f'"{root}/x"'], 0, line=7)])
    assert [why for _, why in rec.refusals] == [
        f"cannot rebuild: {name} (trace line 7): "
        + TABLE.get(name, ("", "not in the audit's allow-list"))[1]
    ]


def test_ignored_calls_cannot_change_names_or_contents() -> None:
    """What the table ignores is a read, an attribute or a call that makes nothing durable."""
    for name, (how, why) in TABLE.items():
        if how == IGNORED:
            assert re.search(r"read|permission|owner|time|nothing durable|chmod|chown|descriptor",
                             why), name  # fmt: skip


def run(tmp_path: Path, text: str, check: object, **kw: object) -> object:
    """Audit ``text`` (a script given the root) under kill and power."""
    root = tmp_path / "ckpts"
    return audit([*script(tmp_path, "w.py", text), str(root)], check, root=root, **kw)  # type: ignore[arg-type]


def whole(expected: bytes, name: str = "weights.bin") -> object:
    """A check: the file, once it exists, holds ``expected``."""

    def check(path: Path) -> bool:
        return not (path / name).exists() or (path / name).read_bytes() == expected

    return check


MARKER_FIRST = """\
# 29.1: weights, then a DONE marker with contents; only the directories fsynced.
import os, sys
root = sys.argv[1]; os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f: f.write(b"w" * 8192)
with open(os.path.join(root, "DONE"), "w") as f: f.write("ok")
fd = os.open(root, os.O_RDONLY); os.fsync(fd); os.close(fd)
"""


def trusts_done(path: Path) -> None:
    """A resume that trusts a DONE marker reading "ok"."""
    done = path / "DONE"
    if done.exists() and done.read_bytes() == b"ok":
        assert (path / "weights.bin").read_bytes() == b"w" * 8192


def test_power_loss_gives_each_unsynced_file_its_own_fate(tmp_path: Path) -> None:
    """29.1: the marker reached the disk, the weights did not: a state the power model
    builds (every file sharing one fate never shows it)."""
    report = run(tmp_path, MARKER_FIRST, trusts_done, models=["power"])
    assert not report.ok  # type: ignore[attr-defined]
    assert any("seed 0" in n for n in report.notes)  # type: ignore[attr-defined]


FORKED = """\
# 29.3: a forked child writes b.bin on its own fd 3 (unsynced); the parent fsyncs its fd 3.
import os, sys
root = sys.argv[1]; os.makedirs(root)
fd = os.open(os.path.join(root, "a.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
pid = os.fork()
if pid == 0:
    os.close(fd)
    b = os.open(os.path.join(root, "b.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
    assert b == fd
    os.write(b, b"b" * 4096); os._exit(0)
os.waitpid(pid, 0)
os.fsync(fd)   # (the model on main took this for b.bin's fsync)
open(os.path.join(root, "OK"), "w").close()
d = os.open(root, os.O_RDONLY); os.fsync(d); os.close(d)
"""


def b_whole(path: Path) -> None:
    """Once OK is there, b.bin is whole."""
    if (path / "OK").exists():
        assert (path / "b.bin").read_bytes() == b"b" * 4096


def test_a_forked_child_has_its_own_descriptor_table(tmp_path: Path) -> None:
    """29.3: the parent's fsync of its fd 3 does not make the child's fd 3 durable."""
    report = run(tmp_path, FORKED, b_whole, models=["power"])
    assert not report.ok  # type: ignore[attr-defined]


THREAD_CWD = """\
# 29.11: one thread chdirs into the root; another's relative unlink lands there.
import os, sys, threading
root = sys.argv[1]; os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f: f.write(b"w" * 100); os.fsync(f.fileno())
open(os.path.join(root, "meta.json"), "w").close()
go = threading.Event()
t = threading.Thread(target=lambda: (go.wait(), os.unlink("weights.bin"))); t.start()
os.chdir(root); go.set(); t.join()
"""


def has_weights_once_begun(path: Path) -> bool:
    """Once meta.json is written, weights.bin is there."""
    return not (path / "meta.json").exists() or (path / "weights.bin").exists()


def test_threads_share_one_working_directory(tmp_path: Path) -> None:
    """29.11: a thread's relative unlink after another thread's chdir is in the root."""
    report = run(tmp_path, THREAD_CWD, has_weights_once_begun, models=["kill"])
    assert not report.ok  # type: ignore[attr-defined]
    assert any("unlink" in v.operation for v in report.violations)  # type: ignore[attr-defined]


RDONLY_TRUNC = """\
# 29.14: open(O_RDONLY | O_TRUNC) truncates on Linux.
import os, sys
root = sys.argv[1]; os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f: f.write(b"w" * 100); os.fsync(f.fileno())
os.close(os.open(os.path.join(root, "weights.bin"), os.O_RDONLY | os.O_TRUNC))
"""


def test_a_read_only_open_with_o_trunc_truncates(tmp_path: Path) -> None:
    """29.14: the truncation is an operation (and the replay matches the run)."""
    report = run(tmp_path, RDONLY_TRUNC, whole(b"w" * 100), models=["kill"])
    assert not report.ok  # type: ignore[attr-defined]


SYNCFS_ELSEWHERE = """\
# 29.10: syncfs of another filesystem (/proc) makes nothing under the root durable.
import os, sys
root = sys.argv[1]; os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f: f.write(b"w" * 8192)
fd = os.open("/proc/self/stat", os.O_RDONLY)
import ctypes; assert ctypes.CDLL(None, use_errno=True).syncfs(fd) == 0
open(os.path.join(root, "DONE"), "w").close()
d = os.open(root, os.O_RDONLY); os.fsync(d)
"""


def done_means_whole(path: Path) -> bool:
    """A DONE marker is there only with the weights whole."""
    return not (path / "DONE").exists() or (path / "weights.bin").read_bytes() == b"w" * 8192


def test_syncfs_of_another_filesystem_syncs_nothing_here(tmp_path: Path) -> None:
    """29.10: only a syncfs on the root's filesystem counts."""
    report = run(tmp_path, SYNCFS_ELSEWHERE, done_means_whole, models=["power"])
    assert not report.ok  # type: ignore[attr-defined]


IO_URING = """\
# 29.9: an io_uring instance: its operations are invisible to the trace.
import ctypes, os, sys
root = sys.argv[1]; os.makedirs(root)
open(os.path.join(root, "x"), "w").close()
ctypes.CDLL(None, use_errno=True).syscall(425, 4, ctypes.create_string_buffer(120))
"""

DSYNC = """\
# 29.8: an O_DSYNC write makes its own range durable, not another descriptor's writes.
import os, sys
root = sys.argv[1]; os.makedirs(root)
p = os.path.join(root, "weights.bin")
a = os.open(p, os.O_WRONLY | os.O_CREAT, 0o644); os.write(a, b"w" * 8192)
b = os.open(p, os.O_WRONLY | os.O_DSYNC); os.pwrite(b, b"W", 0)
d = os.open(root, os.O_RDONLY); os.fsync(d)
"""

MSYNC_THEN_STORE = """\
# 29.4: stores after the only msync are not flushed by it.
import mmap, os, sys
root = sys.argv[1]; os.makedirs(root)
fd = os.open(os.path.join(root, "m.bin"), os.O_RDWR | os.O_CREAT, 0o644); os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096); m[:1] = b"a"; m.flush(); m[:1] = b"b"; m.close()
"""


@pytest.mark.parametrize(
    ("text", "said"),
    [(IO_URING, "io_uring_setup"), (DSYNC, "O_SYNC/O_DSYNC"), (MSYNC_THEN_STORE, "msync")],
    ids=["29.9-io_uring", "29.8-o_dsync", "29.4-msync"],
)
def test_what_the_model_cannot_tell_is_refused(tmp_path: Path, text: str, said: str) -> None:
    """29.9, 29.8, 29.4: io_uring, an O_DSYNC write over other unsynced writes and stores
    after an msync are refused (exit 2), never judged."""
    with pytest.raises(CannotRebuild, match=re.escape(said)):
        run(tmp_path, text, lambda p: True)


COPY_IN = """\
# 29.22: shutil.copy from outside into the root (sendfile).
import os, shutil, sys
root = sys.argv[1]; os.makedirs(root)
src = os.path.join(os.path.dirname(root), "vocab.txt")
with open(src, "w") as f: f.write("v" * 5000)
shutil.copy(src, os.path.join(root, "vocab.txt"))
"""


def test_a_copy_from_outside_is_modelled(tmp_path: Path) -> None:
    """29.22: the copied bytes are read from the source; no refusal, and an unsynced copy
    is broken under power."""
    report = run(tmp_path, COPY_IN, whole(b"v" * 5000, "vocab.txt"), models=["power"])
    assert not report.ok  # type: ignore[attr-defined]


ROOT_RENAMED = """\
# 29.7: the audited directory itself renamed away and made again.
import os, sys
root = sys.argv[1]; os.makedirs(root)
open(os.path.join(root, "weights.bin"), "w").close()
os.rename(root, root + ".old"); os.makedirs(root)
"""

LINK_OUT = """\
# 29.12: a file of the tree hard-linked to a name outside it (then rewritten through it).
import os, sys
root = sys.argv[1]; os.makedirs(root)
with open(os.path.join(root, "weights.bin"), "wb") as f: f.write(b"w" * 100)
os.link(os.path.join(root, "weights.bin"), root + ".alias")
with open(root + ".alias", "r+b") as f: f.write(b"X")
"""

SYMLINK_OUT = """\
# 29.5: a content-store layout: the root's file is a symlink to a blob outside it.
import os, sys
root = sys.argv[1]; os.makedirs(root)
blobs = os.path.join(os.path.dirname(root), "blobs"); os.makedirs(blobs)
with open(os.path.join(blobs, "abc"), "wb") as f: f.write(b"w" * 100)
os.symlink("../blobs/abc", os.path.join(root, "model.bin"))
"""


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (ROOT_RENAMED, "the audited directory itself"),
        (LINK_OUT, "hard-linked to a name outside"),
        (SYMLINK_OUT, "a symlink out of the audited tree"),
    ],
    ids=["29.7-root-renamed", "29.12-link-out", "29.5-symlink-out"],
)
def test_what_leaves_the_tree_is_refused(tmp_path: Path, text: str, said: str) -> None:
    """29.7, 29.12, 29.5: the root renamed away, a second name outside, a link out:
    refused (exit 2) rather than judged on a tree the model does not hold."""
    with pytest.raises(CannotRebuild, match=re.escape(said)):
        run(tmp_path, text, lambda p: True)


def test_hard_links_in_the_existing_tree_are_refused(tmp_path: Path) -> None:
    """29.6: a copy would split the user's hard-linked files, so a different tree would be
    audited: refused (and the original is left as it was)."""
    root = tmp_path / "ckpts"
    root.mkdir()
    (root / "a.bin").write_bytes(b"a")
    (root / "b.bin").hardlink_to(root / "a.bin")
    with pytest.raises(CannotRebuild, match="hard-linked"):
        run(tmp_path, "open('/dev/null')\n", lambda p: True)
    assert (root / "a.bin").stat().st_nlink == 2


def test_a_symlink_out_already_in_the_tree_is_refused(tmp_path: Path) -> None:
    """29.5: a link out found in the existing tree: every state would show its live target."""
    root = tmp_path / "ckpts"
    root.mkdir()
    (tmp_path / "blob").write_bytes(b"b")
    (root / "model.bin").symlink_to("../blob")
    with pytest.raises(CannotRebuild, match="symlink out"):
        run(tmp_path, "open('/dev/null')\n", lambda p: True)


def test_a_directory_a_check_turned_into_a_file_is_shown_whole_again(tmp_path: Path) -> None:
    """29.13: after a check replaces a directory by a file, the next state shows the
    directory with its files again (not empty)."""
    shown = Materializer(tmp_path / "root")
    state = (("d", "dir", b""), ("d/x", "file", b"x"))
    shown.show(state)
    shutil.rmtree(tmp_path / "root" / "d")
    (tmp_path / "root" / "d").write_bytes(b"a file now")
    shown.show(state)
    assert (tmp_path / "root" / "d" / "x").read_bytes() == b"x"
