"""A FIFO, socket or device node under the audited directory (attack of main, item 1):
the audit never opens one (opening a FIFO blocks until a writer comes), it refuses with
exit 2 naming it, and the user's directory is put back as it was. Every run here has a
timeout, so that a regression fails instead of hanging."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _audit_scripts import needs_strace

pytestmark = needs_strace

WORKLOAD = 'import os\nos.makedirs("ckpts", exist_ok=True)\nopen("ckpts/w", "wb").write(b"w")\n'


def audit_cli(tmp_path: Path, workload: str = WORKLOAD) -> subprocess.CompletedProcess[str]:
    (tmp_path / "w.py").write_text(workload)
    return subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "audit", "--root", "ckpts",
         "--check", "true", "--", sys.executable, "w.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _socket(path: Path) -> None:
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.fspath(path))
    s.close()


def _device(path: Path) -> None:
    os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # /dev/null's numbers


MAKERS: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (os.mkfifo, "a FIFO (named pipe)"),
    "socket": (_socket, "a socket"),
    "device": (_device, "a character device"),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_special_file_already_in_the_directory_is_refused_not_opened(
    tmp_path: Path, kind: str
) -> None:
    """The directory the user has holds a FIFO (a socket, a device node) before the audit:
    exit 2 in one line naming it, the workload never run, the directory put back."""
    make, what = MAKERS[kind]
    (tmp_path / "ckpts" / "sub").mkdir(parents=True)
    node = tmp_path / "ckpts" / "sub" / "node"
    try:
        make(node)
    except PermissionError:
        pytest.skip(f"cannot make {what} here (needs CAP_MKNOD)")
    run = audit_cli(tmp_path)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert f"sub/node is {what}" in run.stderr, run.stderr
    assert not (tmp_path / "ckpts" / "w").exists(), "the workload ran"
    assert stat.S_IFMT(os.lstat(node).st_mode) == stat.S_IFMT(
        {"fifo": stat.S_IFIFO, "socket": stat.S_IFSOCK, "device": stat.S_IFCHR}[kind]
    ), "the user's node was not put back"


def test_a_fifo_the_workload_makes_is_refused_by_name(tmp_path: Path) -> None:
    """A workload that makes a FIFO under the directory: exit 2, the FIFO named once."""
    run = audit_cli(tmp_path, WORKLOAD + 'os.mkfifo("ckpts/pipe")\n')
    assert run.returncode == 2, run.stderr
    assert "pipe: cannot rebuild: mknodat" in run.stderr, run.stderr
    assert "pipe: on disk after the run" not in run.stderr, run.stderr
