"""Outside attacks on issue 29 (session 15, atk29): each test was a defect, marked xfail
(strict) until fixed (s15-auditfix); all are fixed now.

Each runs ``atomic-ckpt audit`` end to end (the CLI, as a user does) on a tiny workload in
``tmp_path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _audit_scripts import needs_strace

pytestmark = needs_strace

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (a mount)")


def write(where: Path, name: str, text: str) -> Path:
    path = where / name
    path.write_text(textwrap.dedent(text))
    return path


def run_audit(where: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``atomic-ckpt audit ARGS`` run in ``where`` with this Python."""
    return subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "audit", *args],
        cwd=where,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def tree(root: Path) -> dict[str, bytes | None]:
    """Every entry under ``root``: a file's bytes, None for a directory."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = Path(p).read_bytes()
    return out


# ---- 1. a symlink out of the tree spelled through a symlink to "." (item 5 bypassed)

CONTENT_STORE = """\
    # the weights live in ../blobs (a content store), reached from ckpts/model.bin through
    # ckpts/here -> . ; the blob is never fsynced, so a power loss can lose it
    import os
    os.makedirs("ckpts")
    os.makedirs("blobs")
    with open("blobs/abc", "wb") as f:
        f.write(b"w" * 100)
    os.symlink(".", "ckpts/here")
    os.symlink("here/../blobs/abc", "ckpts/model.bin")
    d = os.open("ckpts", os.O_RDONLY)
    os.fsync(d)
    os.close(d)
"""

CONTENT_CHECK = """\
    import sys
    from pathlib import Path
    p = Path(sys.argv[1]) / "model.bin"
    sys.exit(p.is_symlink() and p.read_bytes() != b"w" * 100)
"""


def test_a_symlink_leading_out_through_a_link_to_dot_is_not_called_clean(tmp_path: Path) -> None:
    """ckpts/model.bin -> here/../blobs/abc with ckpts/here -> . leads to ../blobs/abc."""
    write(tmp_path, "workload.py", CONTENT_STORE)
    write(tmp_path, "check.py", CONTENT_CHECK)
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check", f"{sys.executable} check.py ckpts", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert done.returncode in (1, 2), done.stdout + done.stderr
    assert (tmp_path / "blobs" / "abc").read_bytes() == b"w" * 100


def test_an_existing_symlink_out_through_a_link_to_dot_is_not_called_clean(
    tmp_path: Path,
) -> None:
    """The user's ckpts/ already holds here -> . and model.bin -> here/../blobs/abc; the
    run rewrites the blob unsynced: refused as the plain ../blobs/abc link is."""
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "abc").write_bytes(b"w" * 100)
    os.symlink(".", tmp_path / "ckpts" / "here")
    os.symlink("here/../blobs/abc", tmp_path / "ckpts" / "model.bin")
    write(
        tmp_path,
        "workload.py",
        """\
        import os
        with open("blobs/abc", "wb") as f:  # the linked blob rewritten, never fsynced
            f.write(b"w" * 100)
        fd = os.open("ckpts/log", os.O_WRONLY | os.O_CREAT)
        os.write(fd, b"x")
        os.fsync(fd)
        os.close(fd)
        """,
    )
    write(tmp_path, "check.py", CONTENT_CHECK)
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check", f"{sys.executable} check.py ckpts", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert done.returncode in (1, 2), done.stdout + done.stderr


STAGED_LINK = """\
    # staged in ckpts/staging/5/, promoted by a rename to ckpts/5/: the relative link
    # ../../blobs/abc led to ckpts/blobs/abc while staged, to ../blobs/abc (outside) after
    import os
    os.makedirs("ckpts/staging/5")
    os.makedirs("blobs")
    with open("blobs/abc", "wb") as f:
        f.write(b"w" * 100)
    os.symlink("../../blobs/abc", "ckpts/staging/5/model.bin")
    os.rename("ckpts/staging/5", "ckpts/5")
    d = os.open("ckpts", os.O_RDONLY)
    os.fsync(d)
    os.close(d)
"""

STAGED_CHECK = """\
    import os, sys
    p = os.path.join(sys.argv[1], "5", "model.bin")
    sys.exit(os.path.islink(p) and (not os.path.exists(p) or open(p, "rb").read() != b"w" * 100))
"""


def test_a_symlink_that_leads_out_after_its_directory_is_renamed_is_not_called_clean(
    tmp_path: Path,
) -> None:
    """ckpts/staging/5/model.bin -> ../../blobs/abc, then staging/5 renamed to ckpts/5."""
    write(tmp_path, "workload.py", STAGED_LINK)
    write(tmp_path, "check.py", STAGED_CHECK)
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check", f"{sys.executable} check.py ckpts", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert done.returncode in (1, 2), done.stdout + done.stderr


# ---- 2. two audits of nested directories at once: the user's directory is lost

INNER_WORKLOAD = """\
    # the inner run replaces its directory's old checkpoint
    import os
    os.remove("ckpts/sub/keep.bin")
    with open("ckpts/sub/new.bin", "wb") as f:
        f.write(b"n" * 10)
"""

OUTER_WORKLOAD = """\
    import os, sys
    open(sys.argv[1], "w").close()  # outside the tree: "the outer audit has parked ckpts"
    with open("ckpts/top.bin", "wb") as f:
        f.write(b"t" * 10)
"""

INNER_CHECK = """\
    # the inner audit's check: at the first state without keep.bin, starts the outer audit
    # (detached, as a colleague would) and returns once that one has parked ckpts/
    import os, subprocess, sys, time
    from pathlib import Path

    def check(root):
        here = Path(__file__).parent
        if (here / "outer.started").exists() or (Path(root) / "keep.bin").exists():
            return True
        (here / "outer.started").touch()
        log = open(here / "outer.log", "w")
        outer = subprocess.Popen(
            [sys.executable, "-m", "atomic_ckpt.cli", "audit", "--root", "ckpts",
             "--max-states", "2", "--check", f"{sys.executable} outer_check.py", "--",
             sys.executable, "outer_workload.py", str(here / "outer.recorded")],
            cwd=here, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        for _ in range(1200):  # until the outer audit checks, or ends (it refused)
            if (here / "outer.checking").exists() or outer.poll() is not None:
                break
            time.sleep(0.1)
        return True
"""

OUTER_CHECK = """\
    # the outer audit's check: waits until the inner audit has ended
    import os, sys, time
    open("outer.checking", "w").close()
    for _ in range(1200):
        if os.path.exists("inner.done"):
            break
        time.sleep(0.1)
"""


def test_two_audits_of_nested_directories_leave_the_users_files(tmp_path: Path) -> None:
    """An audit of ckpts/sub, then one of ckpts/ while the first runs: both end, and
    ckpts/ holds what it held before (or the second refuses to start)."""
    (tmp_path / "ckpts" / "sub").mkdir(parents=True)
    (tmp_path / "ckpts" / "sub" / "keep.bin").write_bytes(b"USER DATA")
    (tmp_path / "ckpts" / "top.bin").write_bytes(b"USER TOP")
    before = tree(tmp_path / "ckpts")
    write(tmp_path, "inner_workload.py", INNER_WORKLOAD)
    write(tmp_path, "outer_workload.py", OUTER_WORKLOAD)
    write(tmp_path, "inner_check.py", INNER_CHECK)
    write(tmp_path, "outer_check.py", OUTER_CHECK)
    inner = run_audit(
        tmp_path, "--root", "ckpts/sub", "--check-python",
        "inner_check:check", "--", sys.executable, "inner_workload.py",
    )  # fmt: skip
    (tmp_path / "inner.done").touch()
    for _ in range(1200):  # the outer audit ends by itself once inner.done exists
        log = (tmp_path / "outer.log").read_text() if (tmp_path / "outer.log").exists() else ""
        if "clean" in log or "BROKEN" in log or "error" in log:
            break
        time.sleep(0.1)
    time.sleep(1)
    assert inner.returncode in (0, 1, 2), inner.stderr
    assert tree(tmp_path / "ckpts") == before, (tmp_path / "outer.log").read_text()


# ---- 3. a check that starts a daemon (its own session): it changes the user's directory

DAEMON_CHECK = """\
    # the check starts a detached helper (an uploader, a service) that outlives it and
    # tidies "its" directory a moment later
    import os, shutil, sys, time
    root = os.path.abspath(sys.argv[1])
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(3)
            for n in os.listdir(root):
                p = os.path.join(root, n)
                if os.path.isdir(p):
                    shutil.rmtree(p)
            open(os.path.join(root, "uploaded.flag"), "w").close()
        os._exit(0)
"""

SMALL_SAVE = """\
    import os
    fd = os.open("ckpts/a.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.write(fd, b"x" * 100)
    os.fsync(fd)
    os.close(fd)
    os.rename("ckpts/a.tmp", "ckpts/a")
    d = os.open("ckpts", os.O_RDONLY)
    os.fsync(d)
    os.close(d)
"""


def test_a_daemon_started_by_a_check_does_not_touch_the_users_directory(tmp_path: Path) -> None:
    """After the audit returns, nothing it started changes ckpts/ (or it refuses)."""
    (tmp_path / "ckpts" / "0").mkdir(parents=True)
    (tmp_path / "ckpts" / "0" / "w").write_bytes(b"USER DATA")
    before = tree(tmp_path / "ckpts")
    write(tmp_path, "workload.py", SMALL_SAVE)
    write(tmp_path, "check.py", DAEMON_CHECK)
    done = run_audit(
        tmp_path, "--root", "ckpts", "--max-states", "1", "--check",
        f"{sys.executable} check.py ckpts", "--", sys.executable, "workload.py",
    )  # fmt: skip
    time.sleep(5)
    assert done.returncode in (0, 1, 2)
    assert tree(tmp_path / "ckpts") == before, done.stdout + done.stderr


# ---- 4. a directory in an overlayfs lower layer (a container image): a raw EXDEV


@ROOT_ONLY
def test_a_root_in_an_overlay_lower_layer_is_refused_saying_why(tmp_path: Path) -> None:
    """A checkpoint directory baked into a container image (overlayfs lower layer): exit 2
    with a message that names overlayfs and what to do, not a bare errno."""
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (lower / "ckpts" / "1", upper, work, merged):
        d.mkdir(parents=True)
    (lower / "ckpts" / "1" / "w.bin").write_bytes(b"old")
    subprocess.run(
        ["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={lower},upperdir={upper},workdir={work}", str(merged)],
        check=True,
    )  # fmt: skip
    try:
        write(merged, "workload.py", SMALL_SAVE)
        done = run_audit(
            merged, "--root", "ckpts", "--check", "true", "--", sys.executable, "workload.py"
        )
    finally:
        subprocess.run(["umount", str(merged)], check=True)
    assert done.returncode == 2, done.stderr
    assert "Errno 18" not in done.stderr
    assert "overlay" in done.stderr, done.stderr


# ---- 5. an audit killed (SIGKILL, the OOM killer) of a directory that did not exist yet

PRIVATE = Path("/.atomic-ckpt-audit")


def killed_audit(where: Path) -> subprocess.CompletedProcess[str]:
    """An audit of ckpts/ whose first check SIGKILLs the audit itself (as the OOM killer
    would), with a crash state shown at ckpts/."""
    save = SMALL_SAVE.replace("import os\n", "import os\n    os.makedirs('ckpts', exist_ok=True)\n")
    write(where, "workload.py", save)
    return run_audit(
        where, "--root", "ckpts", "--check", "kill -9 $PPID", "--", sys.executable,
        "workload.py",
    )  # fmt: skip


def test_the_audit_after_a_killed_one_does_not_take_its_crash_state_for_the_original(
    tmp_path: Path,
) -> None:
    """ckpts/ did not exist; an audit of it is SIGKILLed while a check runs: the next
    audit refuses (naming the leftover crash state), or ckpts/ does not exist after it."""
    before = set(os.listdir(PRIVATE)) if PRIVATE.is_dir() else set()
    try:
        first = killed_audit(tmp_path)
        assert first.returncode == -9, first.stderr
        second = run_audit(
            tmp_path, "--root", "ckpts", "--check", "true", "--", sys.executable,
            "workload.py",
        )  # fmt: skip
        assert second.returncode == 2 or not (tmp_path / "ckpts").exists(), second.stdout
    finally:
        for name in set(os.listdir(PRIVATE)) - before if PRIVATE.is_dir() else ():
            subprocess.run(["rm", "-rf", str(PRIVATE / name)], check=False)


def test_the_refusal_after_a_killed_audit_says_to_remove_the_crash_state_first(
    tmp_path: Path,
) -> None:
    """ckpts/ existed; an audit of it is SIGKILLed: the next audit's refusal says that
    ckpts/ holds a crash state the killed audit left (to remove before moving back)."""
    (tmp_path / "ckpts" / "0").mkdir(parents=True)
    (tmp_path / "ckpts" / "0" / "w").write_bytes(b"USER DATA")
    before = set(os.listdir(PRIVATE)) if PRIVATE.is_dir() else set()
    try:
        first = killed_audit(tmp_path)
        assert first.returncode == -9, first.stderr
        second = run_audit(
            tmp_path, "--root", "ckpts", "--check", "true", "--", sys.executable,
            "workload.py",
        )  # fmt: skip
        assert second.returncode == 2
        assert "crash state" in second.stderr, second.stderr
    finally:
        for name in sorted(set(os.listdir(PRIVATE)) - before if PRIVATE.is_dir() else ()):
            if name.endswith(".original"):  # put the user's directory back
                subprocess.run(["rm", "-rf", str(tmp_path / "ckpts")], check=False)
                os.rename(PRIVATE / name, tmp_path / "ckpts")
            else:
                subprocess.run(["rm", "-rf", str(PRIVATE / name)], check=False)
        assert (tmp_path / "ckpts" / "0" / "w").read_bytes() == b"USER DATA"


# ---- 6. --check-python functions whose verdict is silently dropped

NAIVE_SAVE = """\
    # the guide's naive save: files straight into ckpts/1/, nothing fsynced
    import os
    os.makedirs("ckpts/1")
    with open("ckpts/1/weights.bin", "wb") as f:
        f.write(b"w" * 4096)
"""

CHECKS = """\
    import os

    def whole(root):
        p = os.path.join(root, "1", "weights.bin")
        return not os.path.isdir(os.path.join(root, "1")) or (
            os.path.exists(p) and open(p, "rb").read() == b"w" * 4096
        )

    async def async_check(root):  # an async loader's check: never awaited
        return whole(root)

    def generator_check(root):  # a check that yields its verdict
        yield whole(root)

    def status_check(root):  # a main()-style check: 1 for broken, 0 for fine
        return 0 if whole(root) else 1

    def no_argument():  # forgot the root parameter: every call is a TypeError
        return True
"""


@pytest.mark.parametrize("function", ["async_check", "generator_check", "status_check"])
def test_a_check_function_whose_verdict_is_not_a_bool_is_not_taken_as_clean(
    tmp_path: Path, function: str
) -> None:
    """On a save a kill breaks, a check whose return value is not True/False/None (never
    awaited, never iterated, an exit status) is found broken or refused, never clean."""
    write(tmp_path, "workload.py", NAIVE_SAVE)
    write(tmp_path, "checks.py", CHECKS)
    whole = run_audit(
        tmp_path, "--root", "ckpts", "--check-python", "checks:whole", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert whole.returncode == 1, whole.stdout + whole.stderr  # the save is broken
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check-python", f"checks:{function}", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert done.returncode in (1, 2), done.stdout + done.stderr


def test_a_check_function_that_takes_no_root_is_a_usage_error(tmp_path: Path) -> None:
    """A TypeError calling the check is no verdict on the save: exit 2, saying so."""
    write(tmp_path, "workload.py", SMALL_SAVE)
    write(tmp_path, "checks.py", CHECKS)
    (tmp_path / "ckpts").mkdir()
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check-python", "checks:no_argument", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr


def test_a_check_command_whose_script_is_missing_is_a_usage_error(tmp_path: Path) -> None:
    """python resmue.py (a typo) rejects even the empty state: no verdict, exit 2."""
    write(tmp_path, "workload.py", SMALL_SAVE)
    (tmp_path / "ckpts").mkdir()
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check", f"{sys.executable} resmue.py ckpts", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr


# ---- 7. a file whose name ends in "..." (strace's own ellipsis): a false "write not seen"

DOTS_SAVE = """\
    import os
    os.makedirs("ckpts/1")
    with open("ckpts/1/w...", "wb") as f:
        f.write(b"w" * 100)
"""


def test_a_file_named_with_three_trailing_dots_is_judged(tmp_path: Path) -> None:
    """ckpts/1/w... written unsynced: judged broken (exit 1), not refused."""
    write(tmp_path, "workload.py", DOTS_SAVE)
    write(
        tmp_path,
        "check.py",
        """\
        import os, sys
        p = os.path.join(sys.argv[1], "1", "w...")
        sys.exit(os.path.exists(p) and open(p, "rb").read() != b"w" * 100)
        """,
    )
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check", f"{sys.executable} check.py ckpts", "--",
        sys.executable, "workload.py",
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr


@ROOT_ONLY
def test_a_root_under_a_same_filesystem_bind_mount_is_audited(tmp_path: Path) -> None:
    """alias/ is a bind mount of real/ (same filesystem): an audit of alias/ckpts runs (or
    refuses saying why), never '[Errno 18] Invalid cross-device link'."""
    real, alias = tmp_path / "real", tmp_path / "alias"
    (real / "ckpts" / "0").mkdir(parents=True)
    (real / "ckpts" / "0" / "w").write_bytes(b"USER DATA")
    alias.mkdir()
    subprocess.run(["mount", "--bind", str(real), str(alias)], check=True)
    try:
        write(alias, "workload.py", SMALL_SAVE)
        done = run_audit(
            alias, "--root", "ckpts", "--check", "true", "--", sys.executable, "workload.py"
        )
    finally:
        subprocess.run(["umount", str(alias)], check=True)
    assert "Errno 18" not in done.stderr, done.stderr
    assert done.returncode in (0, 2), done.stdout + done.stderr
    assert (real / "ckpts" / "0" / "w").read_bytes() == b"USER DATA"


# ---- 8. a disk too full for the audit's copy of the directory


@ROOT_ONLY
def test_a_disk_too_full_for_the_working_copy_is_refused_saying_why(tmp_path: Path) -> None:
    """A 2 MiB filesystem holding a 1.3 MB checkpoint: exit 2, one line that says the copy
    needs that much free space, and the checkpoint intact."""
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        (disk / "ckpts" / "0").mkdir(parents=True)
        data = os.urandom(1_300_000)
        (disk / "ckpts" / "0" / "w").write_bytes(data)
        write(tmp_path, "workload.py", SMALL_SAVE.replace('"ckpts', f'"{disk}/ckpts'))
        done = run_audit(
            disk, "--root", "ckpts", "--check", "true", "--", sys.executable,
            str(tmp_path / "workload.py"),
        )  # fmt: skip
        assert (disk / "ckpts" / "0" / "w").read_bytes() == data
    finally:
        subprocess.run(["umount", str(disk)], check=True)
    assert done.returncode == 2, done.stderr
    assert "[('" not in done.stderr, done.stderr
    assert "space" in done.stderr, done.stderr


# ---- 9. preadv2 at the file offset (-1) moves it, as readv does


def test_preadv2_at_the_file_offset_moves_it(tmp_path: Path) -> None:
    """A header read with preadv2(-1, RWF_HIPRI), then a write and an fsync: the write is
    at 4 (HEADBODY), the save judged (exit 0 with a check that accepts it)."""
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "log").write_bytes(b"HEAD")
    write(
        tmp_path,
        "workload.py",
        """\
        import os
        fd = os.open("ckpts/log", os.O_RDWR)
        os.preadv(fd, [bytearray(4)], -1, os.RWF_HIPRI)  # preadv2(..., -1, RWF_HIPRI)
        os.write(fd, b"BODY")
        os.fsync(fd)
        os.close(fd)
        """,
    )
    done = run_audit(
        tmp_path, "--root", "ckpts", "--check", "true", "--", sys.executable, "workload.py"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "ckpts" / "log").read_bytes() == b"HEAD"
