"""The audit's allow-list: every system call the recorder traces, and how it is replayed.

One table, read by the tracer (what strace traces), the replay (a call touching the
audited tree that the table does not model is refused, never dropped) and the guide's
table (docs/guides/audit.md, checked against this one by the tests).
"""

from __future__ import annotations

MODELLED, REFUSED, IGNORED = "modelled", "refused", "ignored"

# name -> (how, what the replay does with it, or why it refuses it)
TABLE: dict[str, tuple[str, str]] = {
    # descriptors
    "open": (
        MODELLED,
        "a descriptor; O_CREAT makes the name, O_TRUNC truncates (even O_RDONLY), O_TMPFILE "
        "an unnamed file",
    ),
    "openat": (MODELLED, "as open, relative to a directory descriptor"),
    "openat2": (MODELLED, "as openat"),
    "creat": (MODELLED, "open with O_CREAT|O_WRONLY|O_TRUNC"),
    "open_by_handle_at": (REFUSED, "opens a file by handle, not by a name the replay can place"),
    "name_to_handle_at": (IGNORED, "reads a file's handle (opening by it is refused)"),
    "close": (MODELLED, "the descriptor leaves its table"),
    "close_range": (
        MODELLED,
        "the range leaves its table (CLOSE_RANGE_CLOEXEC: marked; CLOSE_RANGE_UNSHARE: the "
        "thread's own copy first)",
    ),
    "dup": (MODELLED, "the new descriptor shares the open file (and its offset)"),
    "dup2": (MODELLED, "as dup"),
    "dup3": (MODELLED, "as dup (O_CLOEXEC: close-on-exec)"),
    "fcntl": (MODELLED, "F_DUPFD(_CLOEXEC) as dup, F_SETFD close-on-exec; the rest nothing"),
    "ioctl": (
        MODELLED,
        "FIOCLEX/FIONCLEX close-on-exec; requests that change no file (TCGETS, FIONREAD, "
        "FIONBIO, FS_IOC_GETFLAGS, FS_IOC_FIEMAP...) nothing; any other on a descriptor in "
        "the tree refused (FICLONE, FICLONERANGE, FIDEDUPERANGE, FS_IOC_SETFLAGS...)",
    ),
    "recvmsg": (
        MODELLED,
        "descriptors received by SCM_RIGHTS: one that refers to the tree refused (it shares "
        "an open file the receiving table cannot place: offset, flags)",
    ),
    "recvmmsg": (MODELLED, "as recvmsg"),
    "pidfd_getfd": (REFUSED, "a copy of another process's descriptor, as a received one"),
    # data
    "read": (MODELLED, "moves the file offset"),
    "readv": (MODELLED, "moves the file offset"),
    "pread64": (IGNORED, "reads, offset unmoved"),
    "preadv": (IGNORED, "reads, offset unmoved"),
    "preadv2": (MODELLED, "reads; at offset -1 moves the file offset, as readv"),
    "write": (
        MODELLED,
        "the bytes (hex dump), at the offset, each separate write its own fate; on "
        "O_SYNC/O_DSYNC its range durable",
    ),
    "writev": (MODELLED, "as write"),
    "pwrite64": (MODELLED, "as write, at the given offset (appends on O_APPEND)"),
    "pwritev": (MODELLED, "as pwrite64"),
    "pwritev2": (MODELLED, "as pwrite64 (offset -1: the file offset)"),
    "lseek": (MODELLED, "sets the file offset"),
    "truncate": (MODELLED, "the file cut or extended with zeros, as each crash state has it"),
    "ftruncate": (MODELLED, "as truncate"),
    "fallocate": (MODELLED, "extends as truncate, punches or zeroes a range; other modes refused"),
    "sendfile": (
        MODELLED,
        "a copy; the source's bytes (inside the tree, or read from outside after the run: "
        "refused if the run changes that file after the copy, or maps it shared and writable)",
    ),
    "copy_file_range": (MODELLED, "as sendfile (an explicit target offset: as pwrite64)"),
    "splice": (REFUSED, "bytes from a pipe, which the trace does not dump"),
    "tee": (IGNORED, "reads a pipe into a pipe, never a file"),
    "vmsplice": (IGNORED, "memory into a pipe or a pipe read into memory, never a file"),
    "mmap": (
        MODELLED,
        "private or read-only: nothing; shared through a writable fd: refused (a file "
        "outside the tree: only if the tree is copied into from it)",
    ),
    "mremap": (REFUSED, "a moved mapping of a file in the tree"),
    "munmap": (IGNORED, "ends a mapping (one through a writable descriptor was refused)"),
    "msync": (IGNORED, "as munmap: a mapping through a writable descriptor was refused"),
    "remap_file_pages": (REFUSED, "rearranges a file mapping"),
    # the i386 personality's own names (a 32-bit program, or int $0x80 from a 64-bit one):
    # strace traces a personality's calls by that personality's names
    "truncate64": (MODELLED, "i386: as truncate"),
    "ftruncate64": (MODELLED, "i386: as ftruncate"),
    "fcntl64": (MODELLED, "i386: as fcntl"),
    "_llseek": (MODELLED, "i386: as lseek (the new offset is the third argument)"),
    "mmap2": (MODELLED, "i386: as mmap"),
    "sendfile64": (MODELLED, "i386: as sendfile"),
    "recvmmsg_time64": (MODELLED, "i386: as recvmsg"),
    "umount": (REFUSED, "i386: as mount"),
    # names
    "mkdir": (MODELLED, "a new directory entry"),
    "mkdirat": (MODELLED, "as mkdir"),
    "mknod": (REFUSED, "a device, FIFO or socket node: the crash states hold files only"),
    "mknodat": (REFUSED, "as mknod (mkfifo is mknodat)"),
    "rmdir": (MODELLED, "as unlink"),
    "unlink": (MODELLED, "the entry removed (one the replay never saw made: refused)"),
    "unlinkat": (MODELLED, "as unlink (AT_REMOVEDIR: rmdir)"),
    "rename": (
        MODELLED,
        "entries moved (two operations across directories; between two names of one file: "
        "nothing, as rename(2) does)",
    ),
    "renameat": (MODELLED, "as rename"),
    "renameat2": (MODELLED, "as rename; RENAME_EXCHANGE swaps; RENAME_WHITEOUT refused"),
    "link": (MODELLED, "a second name for the inode; from outside the tree refused"),
    "linkat": (
        MODELLED,
        "as link (AT_SYMLINK_FOLLOW follows); AT_EMPTY_PATH or /proc/self/fd/N: the "
        "descriptor's file (an O_TMPFILE one named)",
    ),
    "symlink": (
        MODELLED,
        "a symlink; one leading out of the tree (resolved as the kernel does, in any crash "
        "state) is refused",
    ),
    "symlinkat": (MODELLED, "as symlink"),
    "bind": (MODELLED, "a Unix socket bound at a path in the tree (a socket node) refused"),
    "chdir": (MODELLED, "the working directory (shared by CLONE_FS threads)"),
    "fchdir": (MODELLED, "as chdir"),
    # durability
    "fsync": (MODELLED, "the file (or directory) durable"),
    "fdatasync": (MODELLED, "as fsync"),
    "sync": (MODELLED, "everything durable"),
    "syncfs": (MODELLED, "everything durable if the descriptor is on the tree's filesystem"),
    "sync_file_range": (IGNORED, "makes nothing durable (no metadata, no cache flush)"),
    # processes
    "clone": (MODELLED, "CLONE_FILES shares the descriptor table, else copied; CLONE_FS cwd"),
    "clone3": (MODELLED, "as clone"),
    "fork": (MODELLED, "a copied descriptor table and working directory"),
    "vfork": (MODELLED, "as fork"),
    "execve": (MODELLED, "a table of its own without the close-on-exec descriptors"),
    "execveat": (MODELLED, "as execve"),
    "unshare": (MODELLED, "CLONE_FILES: a table of its own (copied); CLONE_FS: its own cwd"),
    # paths resolved against another root or another mount: refused wherever they point
    "chroot": (REFUSED, "later paths are resolved against another root"),
    "pivot_root": (REFUSED, "as chroot"),
    "setns": (REFUSED, "may enter another mount namespace: paths resolved in other mounts"),
    "mount": (REFUSED, "a mount (a bind mount: an alias of the tree the trace cannot place)"),
    "umount2": (REFUSED, "as mount"),
    "move_mount": (REFUSED, "as mount"),
    "open_tree": (REFUSED, "as mount"),
    "fsmount": (REFUSED, "as mount"),
    "mount_setattr": (REFUSED, "as mount"),
    "io_uring_setup": (REFUSED, "io_uring operations are invisible to the trace"),
    "io_uring_enter": (REFUSED, "io_uring operations are invisible to the trace"),
    "io_uring_register": (REFUSED, "io_uring operations are invisible to the trace"),
    "io_submit": (REFUSED, "Linux AIO writes and fsyncs (libaio) are invisible to the trace"),
    "acct": (REFUSED, "process accounting appends a record to the file at each process exit"),
    "swapon": (REFUSED, "the kernel writes swapped-out memory into the file"),
    # attributes: the crash states hold names, contents and mtimes (by the ops), not modes or owners
    "chmod": (IGNORED, "permissions are not part of the crash states"),
    "fchmod": (IGNORED, "as chmod"),
    "fchmodat": (IGNORED, "as chmod"),
    "chown": (IGNORED, "owners are not part of the crash states"),
    "fchown": (IGNORED, "as chown"),
    "fchownat": (IGNORED, "as chown"),
    "lchown": (IGNORED, "as chown"),
    "utimensat": (
        IGNORED,
        "a time set by the workload is not modelled: a state shows each entry's mtime as "
        "its last change's",
    ),
    "setxattr": (REFUSED, "extended attributes are not part of the crash states"),
    "lsetxattr": (REFUSED, "as setxattr"),
    "fsetxattr": (REFUSED, "as setxattr"),
    "removexattr": (REFUSED, "as setxattr"),
    "lremovexattr": (REFUSED, "as setxattr"),
    "fremovexattr": (REFUSED, "as setxattr"),
}

WORKLOAD_WIDE = frozenset(
    {"io_uring_setup", "io_uring_enter", "io_uring_register", "io_submit"}
    | {"chroot", "pivot_root", "setns"}
    | {"mount", "umount", "umount2", "move_mount", "open_tree", "fsmount", "mount_setattr"}
)
"""Refused wherever they point: what they do may reach the tree by any path."""

TRACED = ",".join(TABLE)

STRACE_TRACE = ",".join(f"?{name}" for name in TABLE)
"""strace's ``-e trace=``: a ``?`` lets an older strace that does not know a call run on."""


def guide_table() -> str:
    """The table as the audit guide prints it (Markdown)."""
    rows = ["| system call | replay | what it does in the model (or why it is refused) |"]
    rows.append("|---|---|---|")
    rows += [f"| `{name}` | {how} | {what} |" for name, (how, what) in TABLE.items()]
    return "\n".join(rows)
