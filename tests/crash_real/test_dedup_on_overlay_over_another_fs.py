"""An overlayfs whose upper layer is on another filesystem than its lower one (Apptainer's
``--writable-tmpfs``: an image below, a tmpfs above) reports a regular file's own device,
not the overlay's that its directory has. Dedup and carry must still know an untouched
committed file: no false "written or touched since its commit" warning, a link made, and
no hash of a carry source whose identity matches its manifest."""

from __future__ import annotations

import logging
import os

import pytest
from _real_mounts import Mount, Mounter, _run, mount_or_skip

from atomic_ckpt import CheckpointDir

pytestmark = pytest.mark.root


def _mixed_overlay(mounter: Mounter) -> Mount:
    """An overlay with its lower layer on one tmpfs and upper/work on another."""
    lower = mount_or_skip(mounter, "tmpfs")
    upper = mount_or_skip(mounter, "tmpfs")
    for name in ("upper", "work", "merged"):
        (upper.path / name).mkdir()
    merged = upper.path / "merged"
    opts = f"lowerdir={lower.path},upperdir={upper.path / 'upper'},workdir={upper.path / 'work'}"
    m = Mount("overlay", merged)
    mounter._mounts.append(m)
    _run(["mount", "-t", "overlay", "-o", opts, "overlay", str(merged)])
    m.mountpoints.append(merged)
    return m


def _save(ckpts: CheckpointDir, step: int) -> dict[str, str]:
    with ckpts.begin(step, dedup=True) as commit:
        (commit.path / "frozen.bin").write_bytes(b"\0" * 100_000)
        (commit.path / "trainable.bin").write_bytes(b"step %d" % step)
    return dict(commit.deduped)


def test_dedup_links_an_untouched_file_on_a_mixed_overlay(
    mounter: Mounter, caplog: pytest.LogCaptureFixture
) -> None:
    """The second identical save is deduplicated, and nothing says a file was touched."""
    fs = _mixed_overlay(mounter)
    ckpts = CheckpointDir(fs.path / "ckpts")
    _save(ckpts, 1)
    caplog.set_level(logging.INFO)
    deduped = _save(ckpts, 2)
    touched = [r.getMessage() for r in caplog.records if "written or touched" in r.getMessage()]
    assert touched == []
    assert deduped == {"frozen.bin": "hardlink"}
    ckpts.verify(2)


def test_a_carry_on_a_mixed_overlay_trusts_an_untouched_source(
    mounter: Mounter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source well older than its marker, untouched, is carried without being hashed."""
    from atomic_ckpt._core.l4_protocol import carry as _carry

    fs = _mixed_overlay(mounter)
    ckpts = CheckpointDir(fs.path / "ckpts")
    with ckpts.commit(1) as path:
        (path / "frozen.bin").write_bytes(os.urandom(1 << 20))
    marker = ckpts.path_of(1) / "checkpoint_complete"
    later = os.stat(marker).st_mtime_ns + 10 * 10**9  # not racily clean: the next save's time
    os.utime(marker, ns=(later, later))
    hashed: list[object] = []
    real = _carry.checksum_file
    monkeypatch.setattr(_carry, "checksum_file", lambda *a: hashed.append(a) or real(*a))
    with ckpts.begin(2) as commit:
        assert commit.carry("frozen.bin", from_=1) == "hardlink"
    assert hashed == []
    ckpts.delete(1)
    ckpts.verify(2)
