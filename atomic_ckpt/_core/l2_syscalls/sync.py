"""The durability steps of the commit protocol: one method per fsync of PROTOCOL.md
(and one writeback hint, :meth:`SyncPolicy.start_file`, which makes nothing durable).

A commit calls these at fixed points of its one ordered function
(:func:`atomic_ckpt._core.l4_protocol.commit.publish`); which of them reach the disk is the
policy's business, so the protocol itself has no flags to check.
:class:`SyncPolicy` does every step; :class:`NoSync` (``durable=False``) does
none and keeps only the atomic rename. The crash tests subclass
:class:`SyncPolicy` to switch a single step off and show that the power-loss
simulation notices (``atomic_ckpt.testing.mutants``).
"""

from __future__ import annotations

from pathlib import Path

from atomic_ckpt._core.l1_names.names import MARKER
from atomic_ckpt._core.l2_syscalls import fs as _fs

__all__ = ["NoSync", "SyncPolicy"]


class SyncPolicy:
    """Every durability step of the protocol (the default).

    Subclass and override one method to change one step; each fsync method is
    called with the path it makes durable.
    """

    durable: bool = True
    """False only when no step reaches the disk (lets the tree walk skip idle work)."""

    def file(self, path: Path) -> None:
        """Step 3: a regular file of the checkpoint (its data and size)."""
        _fs.fsync_file(path)

    def start_file(self, path: Path, offset: int = 0, length: int = 0) -> None:
        """Step 3, just before a range of a file is hashed (or, without checksums, for
        the whole file): start writing ``length`` bytes of it from ``offset`` (0: to
        the end) to disk, without waiting.

        Not a durability step (a hint; :meth:`file` must follow): the disk works
        while the file is hashed, so its fsync has less left to wait for.
        """
        _fs.start_file_writeback(path, offset, length)

    def subdir(self, path: Path) -> None:
        """Step 3: a subdirectory of the checkpoint (its entries)."""
        _fs.fsync_dir(path)

    def marker(self, directory: Path, data: bytes, *, tmp: Path | None) -> None:
        """Step 4: write the marker with its data fsynced; through ``tmp`` when given.

        A commit writes it in place (nothing in a staging dir is visible before the
        rename); adopting a directory in place writes through a temporary name, since
        there the marker's rename is the commit point.
        """
        _fs.write_file_durable(directory / MARKER, data, tmp=tmp, sync=True)

    def staging(self, path: Path) -> None:
        """Step 4: the checkpoint directory itself (its entries, the marker's among them)."""
        _fs.fsync_dir(path)

    def root(self, path: Path) -> None:
        """Step 6 (and every change of the root's entries): the root directory."""
        _fs.fsync_dir(path)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoSync(SyncPolicy):
    """No fsync at all (``durable=False``): atomic against process crashes, not power loss."""

    durable = False

    def file(self, path: Path) -> None:
        pass

    def start_file(self, path: Path, offset: int = 0, length: int = 0) -> None:
        pass

    def subdir(self, path: Path) -> None:
        pass

    def marker(self, directory: Path, data: bytes, *, tmp: Path | None) -> None:
        _fs.write_file_durable(directory / MARKER, data, tmp=tmp, sync=False)

    def staging(self, path: Path) -> None:
        pass

    def root(self, path: Path) -> None:
        pass
