"""The strace recorder: every kind of call it models replays to the tree the run left, and
fsyncs made from worker threads count (descriptors belong to the process, not the thread)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from _audit_scripts import needs_strace, script

from atomic_ckpt.testing import audit
from atomic_ckpt.testing.audit import CannotRebuild

pytestmark = needs_strace

ZOO = """\
# One of each call the recorder models, under ROOT; the replay must give the same tree.
import ctypes, os, subprocess, sys, threading
from atomic_ckpt._core.l2_syscalls import fs as _fs
root = sys.argv[1]
os.makedirs(os.path.join(root, "stage"))
os.chdir(root)                                           # relative paths from here on
os.symlink(".", "stage/checkpoint-1")                    # AtomicTrainer's self-link
with open("stage/checkpoint-1/model.bin", "wb") as f:    # written through the symlink
    f.write(b"m" * 3000); f.write(b"n" * 3000)
    t = threading.Thread(target=os.fsync, args=(f.fileno(),)); t.start(); t.join()
fd = os.open("stage/log.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
os.write(fd, b"one\\n"); os.pwrite(fd, b"X", 0); os.write(fd, b"two\\n")
dup = os.dup(fd); os.dup2(dup, 50); os.write(50, b"three\\n"); os.close(fd); os.close(dup)
fd = os.open("stage/state.bin", os.O_RDWR | os.O_CREAT, 0o644)
os.writev(fd, [b"abc", b"def"]); os.lseek(fd, 1, os.SEEK_SET); os.read(fd, 2)
os.write(fd, b"Z"); os.ftruncate(fd, 10); os.posix_fallocate(fd, 0, 16); os.fdatasync(fd)
os.close(fd)
os.truncate("stage/log.txt", 8)
src = os.open("stage/state.bin", os.O_RDONLY)
dst = os.open("stage/copy.bin", os.O_WRONLY | os.O_CREAT, 0o644)
os.sendfile(dst, src, 0, 5); os.copy_file_range(src, dst, 4)
os.close(src); os.close(dst)
os.link("stage/copy.bin", "stage/copy-link.bin")
dirfd = os.open("stage", os.O_RDONLY | os.O_DIRECTORY)
os.mkdir("sub", dir_fd=dirfd)
with open(os.open("sub/leaf", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dirfd), "wb") as f:
    f.write(b"leaf")
os.rename("sub/leaf", "leaf2", src_dir_fd=dirfd, dst_dir_fd=dirfd)
os.rmdir("sub", dir_fd=dirfd); os.fsync(dirfd); os.close(dirfd)
os.makedirs("other"); open("other/x", "w").write("other")
_fs.rename_exchange(os.path.abspath("stage"), os.path.abspath("other"))   # RENAME_EXCHANGE
subprocess.run([sys.executable, "-c", "open('child.txt', 'w').write('from a child')"], check=True)
os.unlink("stage/x"); os.sync()
"""


def test_every_modelled_call_replays_to_the_tree_the_run_left(tmp_path: Path) -> None:
    """Symlinks, O_APPEND, pwrite, dup, writev, lseek, truncate, fallocate, sendfile,
    copy_file_range, links, *at calls, RENAME_EXCHANGE, a child process: no refusal."""
    root = tmp_path / "ckpts"
    seen: list[str] = []
    report = audit(
        [*script(tmp_path, "zoo.py", ZOO), str(root)],
        lambda path: seen.append("checked"),
        root=root,
        models=["kill"],
        max_states=3,
    )
    assert report.ok
    assert report.operations > 25
    assert report.checked == 3


ATOMIC_FILE = """\
# tmp file, fsync (from a worker thread), rename over the final name, fsync the directory.
import os, sys, threading
root, durable = sys.argv[1], sys.argv[2] == "fsync"
os.makedirs(root, exist_ok=True)
def fsync_in_thread(fd):
    if durable:
        t = threading.Thread(target=os.fsync, args=(fd,)); t.start(); t.join()
for step in (1, 2):
    tmp = os.path.join(root, "model.tmp")
    with open(tmp, "wb") as f:
        f.write(bytes([step]) * 5000)
        f.flush()
        fsync_in_thread(f.fileno())
    os.rename(tmp, os.path.join(root, "model.bin"))
    d = os.open(root, os.O_RDONLY)
    fsync_in_thread(d)
    os.close(d)
"""


def whole(root: Path) -> None:
    """model.bin, where there is one, holds one save's bytes in full."""
    path = root / "model.bin"
    if path.exists():
        data = path.read_bytes()
        assert data in (b"\x01" * 5000, b"\x02" * 5000), f"{len(data)} bytes, not one save"


@pytest.mark.parametrize("durable", ["fsync", "no-fsync"])
def test_fsyncs_from_worker_threads_make_a_rename_durable(tmp_path: Path, durable: str) -> None:
    """write, fsync (in a thread), rename, fsync dir: clean under power; without fsync not."""
    root = tmp_path / "ckpts"
    report = audit(
        [*script(tmp_path, "atomic_file.py", ATOMIC_FILE), str(root), durable], whole, root=root
    )
    assert report.by_model("kill") == ()  # rename-over is atomic for a process crash
    if durable == "fsync":
        assert report.ok, report
    else:
        assert report.by_model("power"), report
        assert any("model.bin: zero-filled" in d for v in report.violations for d in v.damaged)


MAPPED = """\
# Writes a file through a shared mapping and flushes it (msync MS_SYNC): the trace sees it.
import mmap, os, sys
os.makedirs(sys.argv[1])
fd = os.open(os.path.join(sys.argv[1], "mapped.bin"), os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
m[:4096] = b"m" * 4096
m.flush()
m.close()
os.fsync(fd)
os.close(fd)
"""


def test_a_mapping_flushed_with_msync_is_refused(tmp_path: Path) -> None:
    """mmap + msync: the trace cannot tell the bytes in the mapping at the msync from
    stores made after it (issue 29.4), so a shared mapping through a writable descriptor
    is refused at the mmap, whatever follows it."""
    root = tmp_path / "ckpts"
    with pytest.raises(CannotRebuild, match="mapped shared through a descriptor open for"):
        audit([*script(tmp_path, "mapped.py", MAPPED), str(root)], lambda p: None, root=root)


def test_a_write_by_a_process_outside_the_trace_is_refused(tmp_path: Path) -> None:
    """A process started before the audit writes into DIR during the run: CannotRebuild."""
    root = tmp_path / "ckpts"
    go = tmp_path / "go"
    helper = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys, time\n"
         "while not os.path.exists(sys.argv[1]): time.sleep(0.01)\n"
         "open(os.path.join(sys.argv[2], 'foreign.bin'), 'wb').write(b'not traced')\n",
         str(go), str(root)],
    )  # fmt: skip
    workload = script(
        tmp_path,
        "waits.py",
        "import os, sys, time\n"
        "os.makedirs(sys.argv[1])\n"
        "open(sys.argv[2], 'w').close()\n"
        "while not os.path.exists(os.path.join(sys.argv[1], 'foreign.bin')): time.sleep(0.01)\n"
        "time.sleep(0.2)\n",
    )
    try:
        with pytest.raises(CannotRebuild) as info:
            audit([*workload, str(root), str(go)], "true", root=root)
    finally:
        helper.wait(timeout=60)
    assert info.value.paths == ["foreign.bin"]
    assert "never made it" in str(info.value)


SHORT_WRITES = """\
# A disk that fills up mid-save: writes cut short at the file size limit (EFBIG after).
import os, resource, sys
root = sys.argv[1]
os.makedirs(root)
fd = os.open(os.path.join(root, "model.bin"), os.O_WRONLY | os.O_CREAT, 0o644)
resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
assert os.writev(fd, [b"a" * 600, b"b" * 600]) == 1000      # short: 400 bytes not written
os.lseek(fd, 900, os.SEEK_SET)
assert os.write(fd, b"c" * 300) == 100                        # short again
try:
    os.write(fd, b"d")
except OSError:                                               # EFBIG (SIGXFSZ is ignored)
    pass
os.close(fd)
"""


def test_short_writes_replay_as_the_bytes_the_kernel_wrote(tmp_path: Path) -> None:
    """A write or writev cut short (a full disk, a file size limit) wrote only the first
    bytes its return value counts: the replay gives the tree the run left, no refusal."""
    root = tmp_path / "ckpts"
    final = b"a" * 600 + b"b" * 300 + b"c" * 100

    def written_so_far(path: Path) -> None:
        data = (path / "model.bin").read_bytes() if (path / "model.bin").exists() else b""
        versions = (b"a" * 600 + b"b" * 400, final)  # never the 1200 bytes writev was given
        assert any(v.startswith(data) for v in versions), f"{len(data)} bytes"

    report = audit(
        [*script(tmp_path, "short.py", SHORT_WRITES), str(root)],
        written_so_far,
        root=root,
        models=["kill"],
    )
    assert report.ok, report.render()
    assert report.checked >= 3
