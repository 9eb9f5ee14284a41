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

import os
from collections.abc import Iterable, Iterator

from atomic_ckpt.testing._mirror import _UNIVERSE
from atomic_ckpt.testing.audit._strace import AT_FDCWD, Call, fd_arg, unescape
from atomic_ckpt.testing.audit._syscalls import IGNORED, MODELLED, TABLE, WORKLOAD_WIDE
from atomic_ckpt.testing.audit._trace._data import _Data
from atomic_ckpt.testing.audit._trace._descriptors import _Descriptors
from atomic_ckpt.testing.audit._trace._durability import _Durability
from atomic_ckpt.testing.audit._trace._model import canonical
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
            if call.name in ("link", "linkat"):
                self._outside_link(call)
            if self.copied_from and call.name in _CHANGES:
                self._source_changed(call)
            self.calls += 1
            self.line, self.start = call.line, call.start
            self.unplaced = None
            getattr(self, "_sys_" + call.name)(call)
            if self.unplaced is not None and call.name in _CHANGES:
                self._refuse(call, _UNPLACED.format(self.unplaced), self._touched(call))
        self._flush()

    def _outside_link(self, call: Call) -> None:
        """A hard link between two names outside the tree: either names the file a copy
        in may read from (round 15: a change through the other name, gone by the end of
        the run, was unseen)."""
        at = 0 if call.name == "link" else 1
        if len(call.args) < at * 2 + 2:
            return
        dirs = (None, None) if at == 0 else (call.args[0], call.args[2])
        old, new = (
            canonical(self._absolute(call.tid, d, unescape(call.args[i])))
            for d, i in zip(dirs, (at, at * 2 + 1), strict=True)
        )
        if self._rel(old) is None and self._rel(new) is None:
            names = self.outside_names.get(old) or self.outside_names.get(new) or set()
            names |= {old, new}
            for name in names:
                self.outside_names[name] = names

    def _source_changed(self, call: Call) -> None:
        """A change to a file outside the tree that an earlier copy read from: that copy's
        bytes, read after the run, are not the ones it copied (round 13, defect 3)."""
        for path in _changed_paths(self, call):
            names = self.outside_names.get(canonical(path), {canonical(path)})
            lines = [self.copied_from.pop(name, None) for name in names]
            line = next((n for n in lines if n is not None), None)
            if line is None:  # another name of it (a hard link): the same inode now
                try:
                    st = os.stat(path)
                except (OSError, ValueError):
                    continue
                line = self.copied_from.pop(self.copied_ids.get((st.st_dev, st.st_ino), ""), None)
            if line is not None:
                self._refuse(
                    call,
                    f"{path} changed after a copy from it into the tree (trace line {line}): "
                    "the bytes that copy took are no longer there to read; copy from a file "
                    "the run does not change afterwards (a staging file of its own per save)",
                    path,
                )


def _changed_paths(rec: TraceRecorder, call: Call) -> list[str]:
    """The paths whose contents or names ``call`` changes (a read is no change)."""
    name, args = call.name, call.args
    if name in ("open", "openat", "openat2", "creat"):
        flags = {"open": 1, "openat": 2}.get(name)
        text = args[flags] if flags is not None and len(args) > flags else "".join(args)
        truncates = name == "creat" or "O_TRUNC" in text or _o_trunc(text)
        return [call.ret_path] if truncates and call.ret_path else []
    if name in ("sendfile", "sendfile64", "copy_file_range"):
        target = args[2] if name == "copy_file_range" and len(args) > 2 else args[0]
        return [p for p in (fd_arg(target)[1],) if p]
    paths: list[str] = []
    base: str | None = None
    for arg in args:
        fd, decoration = fd_arg(arg)
        if decoration is not None:
            paths.append(decoration)
        elif arg.startswith('"'):
            paths.append(os.path.join(base or rec._cwd(call.tid)[0], unescape(arg)))
        base = decoration if fd != AT_FDCWD else None
    return paths


def _o_trunc(text: str) -> bool:
    """Raw open flags (``0x241``, or ``flags=0x241`` in openat2's struct) hold O_TRUNC."""
    at = text.find("flags=")
    raw = text[at + 6 :].split(",", 1)[0].rstrip("}") if at >= 0 else text
    try:
        return bool(int(raw, 0) & os.O_TRUNC)
    except ValueError:
        return False


_SYNCS = frozenset({"fsync", "fdatasync"})
_CHANGES = frozenset(
    {"write", "writev", "pwrite64", "pwritev", "pwritev2", "truncate", "ftruncate"}
    | {"fallocate", "sendfile", "copy_file_range", "open", "openat", "openat2", "creat"}
    | {"mkdir", "mkdirat", "rmdir", "unlink", "unlinkat", "rename", "renameat", "renameat2"}
    | {"link", "linkat", "symlink", "symlinkat", "truncate64", "ftruncate64", "sendfile64"}
)
"""The modelled calls that change a file or a name (a sync that never returned is taken
as not made: the pessimistic side)."""
_UNPLACED = (
    "a path relative to {} (strace prints no path longer than PATH_MAX), so where it "
    "changed what cannot be told; keep the tree's paths under PATH_MAX (4096 bytes)"
)
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
