"""What a refusal's errno means: the filesystem cannot do this at all (no symlinks, no hard
links, no reflinks, no renameat2 flags), rather than that this call failed.

Each set is defined once here; the syscall module (:mod:`.fs`), :mod:`.share`, the protocol
and the integrations test an ``OSError.errno`` against it to choose their fallback. ENOTSUP
is EOPNOTSUPP on Linux; both are named where either may come.
"""

from __future__ import annotations

import errno

__all__ = ["EXCHANGE_UNSUPPORTED", "HARDLINK_REFUSED", "REFLINK_REFUSED", "SYMLINK_REFUSED"]

EXCHANGE_UNSUPPORTED = frozenset({errno.EINVAL, errno.ENOSYS, errno.EXDEV, errno.ENOTSUP})
"""errnos meaning "this kernel or filesystem cannot do renameat2 with flags"."""

SYMLINK_REFUSED = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
"""What ``symlink()`` fails with on a filesystem without symlinks (vfat, exFAT, some SMB
mounts): EPERM, EOPNOTSUPP (also ENOTSUP), ENOSYS, EINVAL. EPERM is also "may not write
here": a caller that falls back checks the directory is writable."""

HARDLINK_REFUSED = frozenset(
    {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}
)
"""errnos meaning "this filesystem (or this file) cannot take another hard link"."""

REFLINK_REFUSED = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS}
)
"""errnos meaning "this filesystem (or this pair of files) cannot be reflinked"."""
