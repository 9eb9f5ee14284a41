"""The second recorder of the crash model: a system-call trace of any process tree.

:class:`TraceRecorder` replays the calls of :func:`._strace.read_calls` on the model of
the audited directory (the same inodes and operations the library's own hooks produce,
:mod:`atomic_ckpt.testing._mirror`), so :class:`~atomic_ckpt.testing._states._CrashModel`
rebuilds the crash states of either. Descriptors are tracked per descriptor table (one
per process, shared by its threads), file offsets per open file. A file's consecutive
writes collapse into one operation (before, torn half-way, after): nothing can tell the
boundaries between them apart but a crash in the middle, which the torn state stands for.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from atomic_ckpt.testing._mirror import _UNIVERSE
from atomic_ckpt.testing.audit._strace import Call, fd_arg
from atomic_ckpt.testing.audit._syscalls import IGNORED, MODELLED, TABLE, WORKLOAD_WIDE
from atomic_ckpt.testing.audit._trace._data import _Data
from atomic_ckpt.testing.audit._trace._descriptors import _Descriptors
from atomic_ckpt.testing.audit._trace._durability import _Durability
from atomic_ckpt.testing.audit._trace._names import _Names
from atomic_ckpt.testing.audit._trace._processes import _Processes

__all__ = ["TraceRecorder"]


class TraceRecorder(_Descriptors, _Data, _Names, _Durability, _Processes):
    """Builds the crash model's operations from the system calls of an audited workload.

    ``root`` is the audited directory (durable by assumption, like the simulator's
    universe); calls outside it are ignored. :attr:`unseen` collects the files whose
    contents the trace cannot tell (a shared writable mapping, a copy from outside):
    the replay check names them if the final tree disagrees.
    """

    # Dispatch: a completed call named N goes to the family method ``_sys_N`` (descriptors,
    # data, names, durability, processes) when the allow-list (:mod:`.._syscalls`) models
    # it; a call it does not model that touches the tree (or could: io_uring) is refused.

    def feed(self, calls: Iterable[Call]) -> None:
        """Replay ``calls`` (completed system calls, in completion order) on the model."""
        self._inode_names: dict[int, str] = {}
        self._name_tree(_UNIVERSE, "")
        self._outside_links()
        for call in in_canonical_order(calls):
            how, why = TABLE.get(call.name, ("", "not in the audit's allow-list"))
            if how not in (MODELLED, IGNORED):
                touched = self._touched(call)  # named in the refusal: the FIFO, say
                if call.name in WORKLOAD_WIDE or touched is not None:
                    self._refuse(call, why, touched)
                continue
            if call.ret is None and call.unfinished and call.name in _CHANGES:
                touched = self._touched(call)
                if touched is not None:
                    self._refuse(call, _NEVER_RETURNED, touched)
            if call.ret is None or how == IGNORED:
                continue
            self.calls += 1
            self.line, self.start = call.line, call.start
            getattr(self, "_sys_" + call.name)(call)
        self._flush()


_SYNCS = frozenset({"fsync", "fdatasync"})
_CHANGES = frozenset(
    {"write", "writev", "pwrite64", "pwritev", "pwritev2", "truncate", "ftruncate"}
    | {"fallocate", "sendfile", "copy_file_range", "open", "openat", "openat2", "creat"}
    | {"mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2"}
    | {"link", "linkat", "symlink", "symlinkat", "truncate64", "ftruncate64", "sendfile64"}
)
"""The modelled calls that change a file or a name (a sync that never returned is taken
as not made: the pessimistic side)."""
_NEVER_RETURNED = (
    "it never returned (its process was ended inside it, by a signal or another thread's "
    "execve), so whether and how much of it took effect cannot be told; let the process "
    "finish its writes before it is ended"
)


def in_canonical_order(calls: Iterable[Call]) -> Iterator[Call]:
    """``calls``, with each run of consecutive fsyncs that all ran at the same time (each
    began before every other ended: worker threads syncing a commit's files) ordered by
    the path they sync rather than by which returned first, so that their order does not
    change from run to run with the threads' timing. Each made its file durable at some moment
    inside its call, so either order is one the disk may have taken and the completion
    order is no truer; the state where the other file got there first is still built, at
    the crash point before both (one file's data kept, the other's lost)."""
    group: list[Call] = []
    for call in calls:
        if group and call.name in _SYNCS and call.ret is not None and call.start < group[0].line:
            group.append(call)
            continue
        yield from sorted(group, key=lambda c: fd_arg(c.args[0])[1] or "" if c.args else "")
        group = [call] if call.name in _SYNCS and call.ret is not None else []
        if not group:
            yield call
    yield from sorted(group, key=lambda c: fd_arg(c.args[0])[1] or "" if c.args else "")
