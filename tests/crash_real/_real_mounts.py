"""Loop-mounted ext4/xfs/btrfs images, tmpfs and overlayfs for the real-filesystem tests.

Every mount and loop device made here is undone by :meth:`Mounter.close`,
which the fixtures call in a ``finally``: ``umount`` (retried, then ``umount
-l`` as a last resort) and ``losetup -d``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import os
import shutil
import struct
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

KINDS = ("ext4", "xfs", "btrfs", "tmpfs", "overlay")
LOOP_KINDS = ("ext4", "xfs", "btrfs")

# Smallest comfortable images: mkfs.xfs refuses less than 300 MiB, mkfs.btrfs
# about 114 MiB. They are sparse files, so they cost little real space.
IMAGE_MB = {"ext4": 64, "xfs": 300, "btrfs": 128}
IMAGES_TMPFS_MB = 2048
"""The tmpfs the images lie on (its pages are used only as they are written). What is
tested is the filesystem in the image, shut down without flushing to its loop device;
the host is never crashed, so where the image lies changes nothing but the speed of the
loop device's flushes (on the host's disk, each was an fsync of the image file there)."""
MKFS = {
    "ext4": ["mkfs.ext4", "-q", "-F", "-m", "0"],
    "xfs": ["mkfs.xfs", "-q", "-f"],
    "btrfs": ["mkfs.btrfs", "-q", "-f"],
}
PACKAGE = {
    "mkfs.ext4": "e2fsprogs",
    "mkfs.xfs": "xfsprogs",
    "mkfs.btrfs": "btrfs-progs",
    "losetup": "mount",
    "mount": "mount",
    "umount": "mount",
    "strace": "strace",
}

# XFS_IOC_GOINGDOWN == EXT4_IOC_SHUTDOWN == _IOR('X', 125, __u32): what
# `xfs_io -x -c shutdown` calls. NOLOGFLUSH (2) discards what is not yet on
# disk, like a power cut; 1 (LOGFLUSH) would flush the journal first.
_GOINGDOWN = 0x8004587D
_NOLOGFLUSH = 2


def why_not(kind: str) -> str | None:
    """Why ``kind`` cannot be mounted here (not root, a tool missing), or None."""
    if os.geteuid() != 0:
        return f"needs root to mount {kind} (running as uid {os.geteuid()})"
    tools = ["mount", "umount"]
    if kind in LOOP_KINDS:
        tools += ["losetup", MKFS[kind][0]]
    for tool in tools:
        if shutil.which(tool) is None:
            return f"{tool} not found (apt-get install {PACKAGE[tool]})"
    with open("/proc/filesystems") as f:
        known = {line.split()[-1] for line in f if line.strip()}
    if kind not in known and shutil.which("modprobe"):
        subprocess.run(["modprobe", kind], capture_output=True, check=False)
        with open("/proc/filesystems") as f:
            known = {line.split()[-1] for line in f if line.strip()}
    if kind not in known:
        return f"the kernel does not support {kind} (not in /proc/filesystems)"
    return None


def shutdown(mountpoint: Path) -> None:
    """Shut the filesystem down without flushing, as ``xfs_io -x -c shutdown`` does."""
    fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, _GOINGDOWN, struct.pack("I", _NOLOGFLUSH))
    finally:
        os.close(fd)


def mount_or_skip(mounter: Mounter, kind: str, **kwargs: Any) -> Mount:
    """A fresh filesystem of ``kind``, or a pytest skip saying why there can be none here."""
    reason = why_not(kind)
    if reason is not None:
        pytest.skip(reason)
    try:
        return mounter.make(kind, **kwargs)
    except MountFailed as exc:
        pytest.skip(f"cannot mount {kind} here: {exc}")


class MountFailed(RuntimeError):
    """A mount command failed; the message carries its stderr."""


def _run(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise MountFailed(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout.strip()


def _holds_files_under(mnt: Path) -> bool:
    """Whether this process has a file under ``mnt`` open or mapped (which keeps it busy).
    A full garbage collection, which may close such files, takes a large process tenths of
    a second: it runs only then."""
    prefix = str(mnt)
    held = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile (the listing's own descriptor)
            held.append(os.readlink(f"/proc/self/fd/{fd}"))
    with open("/proc/self/maps") as maps:
        held += [line.split(maxsplit=5)[-1].strip() for line in maps]
    return any(p == prefix or p.startswith(prefix + "/") for p in held)


RELEASE_SECONDS = 120.0


def _wait_released(device: str) -> None:
    """Wait until no filesystem on ``device`` is mounted anywhere. An unmount here does
    not end a filesystem that another mount namespace still holds (one made meanwhile by
    any process on the machine copies every mount); mounting the device again would then
    give back that filesystem as it was, shut down, not a recovered one."""
    deadline = time.monotonic() + RELEASE_SECONDS
    while True:
        try:
            os.close(os.open(device, os.O_RDONLY | os.O_EXCL))  # EBUSY while mounted
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise MountFailed(
                    f"{device} is still in use {RELEASE_SECONDS:.0f} s after its unmount "
                    "(mounted in another mount namespace?)"
                ) from exc
        time.sleep(0.1)


@dataclass
class Mount:
    """One mounted filesystem; ``path`` is where the tests put checkpoint roots."""

    kind: str
    path: Path
    mountpoints: list[Path] = field(default_factory=list)
    """Innermost last; unmounted in reverse."""
    device: str | None = None
    options: str = ""
    image: Path | None = None


class Mounter:
    """Makes mounts under ``base`` and guarantees to undo them all in :meth:`close`."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._mounts: list[Mount] = []
        self._devices: list[str] = []
        self._n = 0
        self._images: Path | None = None
        self._images_mounted = False

    def _image_dir(self) -> Path:
        """Where the loop images go: a tmpfs of this Mounter's (the base directory itself
        if no tmpfs can be mounted)."""
        if self._images is None:
            images = self.base / "images"
            images.mkdir()
            size = f"size={IMAGES_TMPFS_MB}m"
            proc = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", size, "tmpfs", str(images)],
                capture_output=True,
                check=False,
            )
            self._images_mounted = proc.returncode == 0
            self._images = images
        return self._images

    def _fresh(self, name: str) -> Path:
        self._n += 1
        path = self.base / f"{name}-{self._n}"
        path.mkdir(parents=True)
        return path

    def make(self, kind: str, *, size_mb: int | None = None, options: str = "") -> Mount:
        """A fresh, empty filesystem of ``kind``, mounted."""
        if kind in LOOP_KINDS:
            return self._loop(kind, size_mb or IMAGE_MB[kind], options)
        if kind == "tmpfs":
            mnt = self._fresh("tmpfs")
            m = Mount(kind, mnt)
            self._mounts.append(m)
            _run(["mount", "-t", "tmpfs", "-o", f"size={size_mb or 64}m", "tmpfs", str(mnt)])
            m.mountpoints.append(mnt)
            return m
        if kind == "overlay":
            return self.overlay(options=options)
        raise ValueError(kind)

    def _loop(self, kind: str, size_mb: int, options: str) -> Mount:
        work = self._fresh(kind)
        image = self._image_dir() / f"{work.name}.img"
        with open(image, "wb") as f:
            f.truncate(size_mb << 20)
        _run([*MKFS[kind], str(image)])
        device = _run(["losetup", "--find", "--show", str(image)])
        self._devices.append(device)
        mnt = work / "mnt"
        mnt.mkdir()
        m = Mount(kind, mnt, device=device, options=options, image=image)
        self._mounts.append(m)
        self.mount_again(m)
        return m

    def mount_again(self, m: Mount) -> None:
        """Mount a loop filesystem (again, after :meth:`unmount`): journal recovery runs here."""
        assert m.device is not None
        _wait_released(m.device)
        cmd = ["mount", "-t", m.kind]
        if m.options:
            cmd += ["-o", m.options]
        _run([*cmd, m.device, str(m.path)])
        m.mountpoints.append(m.path)

    def overlay(self, *, lower: Path | None = None, options: str = "") -> Mount:
        """An overlayfs on a fresh tmpfs (upper, work) over ``lower`` (or an empty dir)."""
        base = self.make("tmpfs")
        for name in ("lower", "upper", "work", "merged"):
            (base.path / name).mkdir()
        if lower is not None:
            shutil.copytree(lower, base.path / "lower", symlinks=True, dirs_exist_ok=True)
        merged = base.path / "merged"
        opts = f"lowerdir={base.path / 'lower'},upperdir={base.path / 'upper'}"
        opts += f",workdir={base.path / 'work'}" + (f",{options}" if options else "")
        m = Mount("overlay", merged, options=options)
        self._mounts.append(m)
        _run(["mount", "-t", "overlay", "-o", opts, "overlay", str(merged)])
        m.mountpoints.append(merged)
        return m

    def unmount(self, m: Mount) -> None:
        """Unmount ``m`` (innermost first); retried, then lazily as a last resort."""
        while m.mountpoints:
            mnt = m.mountpoints.pop()
            if _holds_files_under(mnt):
                gc.collect()  # drop lock files' descriptors held by dead objects
            for attempt in range(5):
                proc = subprocess.run(["umount", str(mnt)], capture_output=True, check=False)
                if proc.returncode == 0:
                    break
                gc.collect()
                time.sleep(0.05 * (attempt + 1))
            else:
                subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)

    def release(self, m: Mount) -> None:
        """Unmount ``m`` now and detach its loop device (for tests that make many)."""
        self.unmount(m)
        if m in self._mounts:
            self._mounts.remove(m)
        if m.device is not None and m.device in self._devices:
            subprocess.run(["losetup", "-d", m.device], capture_output=True, check=False)
            self._devices.remove(m.device)
            shutil.rmtree(m.path.parent, ignore_errors=True)
            if m.image is not None:
                m.image.unlink(missing_ok=True)

    def close(self) -> None:
        """Undo every mount and loop device made here, whatever state they are in."""
        for m in reversed(self._mounts):
            self.unmount(m)
        self._mounts.clear()
        for device in reversed(self._devices):
            subprocess.run(["losetup", "-d", device], capture_output=True, check=False)
        self._devices.clear()
        if self._images is not None and self._images_mounted:
            subprocess.run(["umount", str(self._images)], capture_output=True, check=False)
        # Last resort: anything under base still mounted (a test that raised halfway).
        with open("/proc/mounts") as f:
            stale = [line.split()[1] for line in f if line.split()[1].startswith(str(self.base))]
        for mnt in sorted(stale, reverse=True):
            subprocess.run(["umount", "-l", mnt], capture_output=True, check=False)
