"""Removing a checkpoint where it stands, for a directory the filesystem refuses to rename
aside (EXDEV: a directory of an overlay's lower layer, a container image's checkpoint,
where overlayfs has no ``redirect_dir``).

Its marker goes first, and that is made durable (an fsync of the directory) before
anything else is removed: from then on it is no complete checkpoint, whatever a crash
leaves of it. A crash during the rest leaves a step directory without a marker, which
the scanner skips with a warning and ``clean()`` leaves alone (it cannot tell it from a
legacy checkpoint): remove it by hand (``rm -r``). Under the root lock, so no commit or
reader that takes the lock sees it half removed.
"""

from __future__ import annotations

import contextlib
import errno
import logging
from pathlib import Path

from atomic_ckpt._core.l1_names.names import MARKER
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l4_protocol.root import Root

log = logging.getLogger(__name__)


def refused_rename(exc: BaseException) -> bool:
    """Whether ``exc``, from renaming a checkpoint directory aside in its own root, says
    the filesystem cannot rename that directory at all (EXDEV within one directory)."""
    return isinstance(exc, OSError) and exc.errno == errno.EXDEV


def remove(root: Root, path: Path) -> None:
    """Remove the checkpoint directory ``path`` in place, its marker first and durably
    (call under the root lock; the caller fsyncs the root afterwards)."""
    log.info(
        "%s cannot be renamed aside (EXDEV: an overlay's lower layer?): removing it in "
        "place, its marker first",
        path,
    )
    with contextlib.suppress(FileNotFoundError):
        _fs.unlink(path / MARKER)
    root.sync.subdir(path)  # no longer complete, durably, before the rest goes
    _fs.remove_tree(path)
