"""Each unsynced write of a file its own fate (attack of main, items 2 and 3): a power loss
may keep an older write of a file and lose a newer one, or keep a header written last
without the body before it; a process kill may stop between two writes of one run. The
audit builds those states, so a check that breaks only there is found broken."""

from __future__ import annotations

from pathlib import Path

from _audit_scripts import needs_strace, script

from atomic_ckpt.testing import audit
from atomic_ckpt.testing._states import _CrashModel
from atomic_ckpt.testing.audit import AuditReport
from atomic_ckpt.testing.audit._strace import Call
from atomic_ckpt.testing.audit._trace import TraceRecorder

pytestmark = needs_strace


def run(tmp_path: Path, text: str, check: object, **kw: object) -> AuditReport:
    """Audit ``text`` (a script given the root)."""
    root = tmp_path / "ckpts"
    argv = [*script(tmp_path, "w.py", text), str(root)]
    return audit(argv, check, root=root, **kw)  # type: ignore[arg-type]


HEADER_LAST = """\
# The body first, then seek back and write the header (magic, body length) last; no fsync.
import os, struct, sys
os.makedirs(sys.argv[1])
with open(os.path.join(sys.argv[1], "blob"), "wb") as f:
    f.seek(8)
    f.write(b"b" * 4096)
    f.seek(0)
    f.write(b"HDR!" + struct.pack("<I", 4096))
"""


def trusts_the_header(root: Path) -> None:
    """A check that trusts the header: a file whose magic is there holds its whole body."""
    blob = root / "blob"
    data = blob.read_bytes() if blob.exists() else b""
    if data[:4] == b"HDR!":
        n = int.from_bytes(data[4:8], "little")
        assert data[8 : 8 + n] == b"b" * n, f"header says {n} bytes, body is not whole"


def test_a_header_written_last_may_reach_the_disk_without_its_body(tmp_path: Path) -> None:
    """One run of writes (body, then the header at offset 0): the power state with the
    header kept and the body lost (or zero-filled) is built and fails the check."""
    report = run(tmp_path, HEADER_LAST, trusts_the_header, models=("power",))
    assert not report.ok, report.render()
    said = {v.survived for v in report.violations}
    assert any("write 1 lost" in s or "write 1 zero" in s for s in said), said


def test_a_process_kill_may_stop_between_two_writes_of_one_run(tmp_path: Path) -> None:
    """A kill between the body and the header leaves a placeholder header on a whole body:
    the kill model builds each prefix of a run's separate writes (the placeholder and the
    body, contiguous, are one), not only the run's half-way point."""
    ordered = HEADER_LAST.replace("f.seek(8)", 'f.write(b"NONE" + bytes(4))\n    f.seek(8)')

    def no_header_means_no_body(root: Path) -> None:
        data = (root / "blob").read_bytes() if (root / "blob").exists() else b""
        assert data[:4] == b"HDR!" or data[8:] != b"b" * 4096, "a whole body, no header"

    report = run(tmp_path, ordered, no_header_means_no_body, models=("kill",))
    assert not report.ok, report.render()
    assert any("after write 1 of 2" in v.survived for v in report.violations)


OVERWRITE = """\
# Old contents, then rewritten in place (longer) before a marker; nothing fsynced.
import os, sys
os.makedirs(sys.argv[1])
fd = os.open(os.path.join(sys.argv[1], "state"), os.O_WRONLY | os.O_CREAT, 0o644)
os.write(fd, b"old-contents")
os.pwrite(fd, b"new-contents-longer", 0)
os.close(fd)
with open(os.path.join(sys.argv[1], "marker"), "w") as f:
    f.write("2")
"""


def never_the_old(root: Path) -> None:
    """Broken only in the state where the older write is on disk and the newer is not."""
    state = root / "state"
    assert not (state.exists() and state.read_bytes() == b"old-contents"), "the old state"


def test_an_older_write_may_survive_a_newer_one_over_the_same_range(tmp_path: Path) -> None:
    """Two unsynced writes over one range: the state holding the older write's bytes and
    not the newer's is built (the newer's fate is its own, not merged into the older's)."""
    report = run(tmp_path, OVERWRITE, never_the_old, models=("power",))
    assert not report.ok, report.render()


HEADER_AFTER_MARKER = """\
# The body, a marker file, then the header of the first file: three operations, no fsync.
import os, struct, sys
os.makedirs(sys.argv[1])
fd = os.open(os.path.join(sys.argv[1], "blob"), os.O_WRONLY | os.O_CREAT, 0o644)
os.pwrite(fd, b"b" * 4096, 8)
with open(os.path.join(sys.argv[1], "marker"), "w") as f:
    f.write("1")
os.pwrite(fd, b"HDR!" + struct.pack("<I", 4096), 0)
os.close(fd)
"""


def test_a_later_operation_on_a_file_does_not_carry_an_earlier_ones_bytes(
    tmp_path: Path,
) -> None:
    """The header's operation, kept, holds only its own bytes: with the body's operation
    lost, the header lands on the file's earlier contents (no body), not on a copy of the
    file as it was after both."""
    report = run(tmp_path, HEADER_AFTER_MARKER, trusts_the_header, models=("power",))
    assert not report.ok, report.render()


def test_a_truncate_kept_with_the_write_before_it_lost_holds_zeros(tmp_path: Path) -> None:
    """ftruncate after an unsynced write: a state keeping the truncate but losing the write
    shows the file at its new length with zeros, not with the lost write's bytes."""
    root = tmp_path / "ckpts"
    root.mkdir()
    rec = TraceRecorder(root)
    rec.feed(
        [
            Call(1, "openat", ["AT_FDCWD", f'"{root}/f"', "O_WRONLY|O_CREAT", "0644"], 3),
            Call(1, "write", [f"3<{root}/f>", "", "16"], 16, data=bytearray(b"w" * 16)),
            Call(1, "openat", ["AT_FDCWD", f'"{root}/m"', "O_WRONLY|O_CREAT", "0644"], 4),
            Call(1, "write", [f"4<{root}/m>", "", "1"], 1, data=bytearray(b"M")),
            Call(1, "ftruncate", [f"3<{root}/f>", "8"], 0),
        ]
    )
    model = _CrashModel(rec.ops, rec.inodes)
    names = {op.index for op in rec.ops if op.kind == "entry"}
    write, marker, truncate = (op.index for op in rec.ops if op.kind == "data")

    def f(persisted: set[int]) -> bytes:
        return next(bytes(d) for p, _, d in model._build(persisted, {}) if p == "f")

    assert f(names | {write, marker, truncate}) == b"w" * 8
    assert f(names | {marker, truncate}) == bytes(8), "the lost write's bytes came back"
    assert f(names | {write, marker}) == b"w" * 16
