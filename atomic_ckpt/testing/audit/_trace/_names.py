"""Replay of the name calls: mkdir, unlink, rmdir, rename, link, symlink and their *at forms."""

from __future__ import annotations

import os
import re

from atomic_ckpt.testing.audit._strace import Call, int_arg, unescape
from atomic_ckpt.testing.audit._trace._links import model_lookup, resolve
from atomic_ckpt.testing.audit._trace._model import _Replay

_AT_REMOVEDIR = 0x200
_AT_SYMLINK_FOLLOW = 0x400
_AT_EMPTY_PATH = 0x1000
_PROC_FD = re.compile(r"^/proc/(self|thread-self|\d+)(?:/task/\d+)?/fd/(\d+)$")
_RENAME_NOREPLACE, _RENAME_EXCHANGE, _RENAME_WHITEOUT = 1, 2, 4
_SUN_PATH = re.compile(r'sun_path=("(?:[^"\\]|\\.)*")')


class _Names(_Replay):
    """mkdir, mkdirat, unlink, unlinkat, rmdir, rename, renameat, renameat2, link, linkat,
    symlink, symlinkat."""

    def _sys_mkdir(self, call: Call) -> None:
        self._mkdir(call, None, call.args[0])

    def _sys_mkdirat(self, call: Call) -> None:
        self._mkdir(call, call.args[0], call.args[1])

    def _mkdir(self, call: Call, dirfd: str | None, path: str) -> None:
        where = self._where(call, dirfd, path)
        if where is None:
            return
        parent, name, _, rel = where
        inode = self._new("dir", None)
        self._inode_names[inode] = rel
        self._op("entry", parent, f"{call.name} {rel}", ((name, inode),))

    def _is_root(self, call: Call, dirfd: str | None, path: str) -> bool:
        """Whether ``path`` names the audited directory itself or a directory above it
        (refused: the model holds it durable and always there, so the window without it
        could not be shown; and a parent renamed away takes it along, so that every path
        spelled through the new name is missed: audit5 attack 6)."""
        absolute = os.path.normpath(self._absolute(call.tid, dirfd, unescape(path)))
        if self._rel(absolute) == "":
            self._refuse(call, "the audited directory itself is renamed or removed", ".")
            return True
        if any(base.startswith(absolute.rstrip("/") + "/") for base in self._bases()):
            self._refuse(
                call,
                f"{absolute}, a directory above the audited one, is renamed or removed "
                "(the audited directory goes with it)",
                ".",
            )
            return True
        return False

    def _removed(self, call: Call, dirfd: str | None, path: str) -> None:
        if self._is_root(call, dirfd, path):
            return
        where = self._where(call, dirfd, path)
        if where is None:
            return
        parent, name, inode, rel = where
        if inode is None:  # it succeeded, so the name was there: the replay went astray
            self._refuse(call, f"{rel} was removed, but the replay never saw it made", rel)
            return
        self._op("entry", parent, f"{call.name} {rel}", ((name, None),))

    def _sys_unlink(self, call: Call) -> None:
        self._removed(call, None, call.args[0])

    _sys_rmdir = _sys_unlink

    def _sys_unlinkat(self, call: Call) -> None:
        self._removed(call, call.args[0], call.args[1])

    def _renamed(
        self, call: Call, old: tuple[str | None, str], new: tuple[str | None, str], flags: int
    ) -> None:
        self._flush()  # pending writes are described under the name they were made at
        if self._is_root(call, *old) or self._is_root(call, *new):
            return
        if flags & _RENAME_WHITEOUT:
            self._refuse(call, "RENAME_WHITEOUT (an overlay whiteout)")
            return
        src = self._where(call, *old)
        dst = self._where(call, *new)
        if src is None and dst is None:
            return
        verb = (
            call.name
            + (" RENAME_EXCHANGE" if flags & _RENAME_EXCHANGE else "")
            + (" RENAME_NOREPLACE" if flags & _RENAME_NOREPLACE else "")
        )
        if dst is None:  # moved out of the audited tree: gone from it
            assert src is not None
            if src[2] is not None:
                self._op("entry", src[0], f"{verb} {src[3]} -> (outside)", ((src[1], None),))
            return
        if src is None or src[2] is None:  # moved in from outside: contents never seen
            self._refuse(call, "a file moved in from outside the audited tree", dst[3])
            return
        (sp, sn, _, srel), (dp, dn, other, drel) = src, dst
        moved = src[2]
        if other == moved:  # two names of one file (or one name): rename(2) does nothing
            return
        desc = f"{verb} {srel} {'<->' if flags & _RENAME_EXCHANGE else '->'} {drel}"
        self._inode_names[moved] = drel
        if flags & _RENAME_EXCHANGE:
            assert other is not None
            self._inode_names[other] = srel
            if sp == dp:
                self._op("entry", sp, desc, ((sn, other), (dn, moved)))
            else:
                self._op("entry", dp, desc + " (new side)", ((dn, moved),))
                self._op("entry", sp, desc + " (old side)", ((sn, other),))
        elif sp == dp:
            self._op("entry", sp, desc, ((sn, None), (dn, moved)))
        else:  # two directories: two entry operations, as the simulator models them
            self._op("entry", dp, desc + " (new name)", ((dn, moved),))
            self._op("entry", sp, desc + " (old name gone)", ((sn, None),))
        if self.inodes[moved].kind == "dir":
            self._name_tree(moved, drel + "/")

    def _sys_rename(self, call: Call) -> None:
        self._renamed(call, (None, call.args[0]), (None, call.args[1]), 0)

    def _sys_renameat(self, call: Call) -> None:
        self._renamed(call, (call.args[0], call.args[1]), (call.args[2], call.args[3]), 0)

    def _sys_renameat2(self, call: Call) -> None:
        flags = int_arg(call.args[4])
        self._renamed(call, (call.args[0], call.args[1]), (call.args[2], call.args[3]), flags)

    def _hard_linked(
        self,
        call: Call,
        old: tuple[str | None, str],
        new: tuple[str | None, str],
        *,
        follow: bool,
    ) -> None:
        src = self._where(call, *old, follow=follow)
        dst = self._where(call, *new)
        if dst is None:
            if src is not None and src[2] is not None:  # a second name outside the tree:
                self._refuse(  # writes through it would change the tree unseen
                    call, "a file in the audited tree hard-linked to a name outside it", src[3]
                )
            return
        if src is None or src[2] is None:
            self._refuse(call, "a hard link to a file outside the audited tree", dst[3])
            return
        self._op("entry", dst[0], f"{call.name} {src[3]} -> {dst[3]}", ((dst[1], src[2]),))

    def _sys_link(self, call: Call) -> None:
        self._hard_linked(call, (None, call.args[0]), (None, call.args[1]), follow=False)

    def _sys_linkat(self, call: Call) -> None:
        flags = int_arg(call.args[4])
        proc = _PROC_FD.match(unescape(call.args[1]))
        if (flags & _AT_EMPTY_PATH and unescape(call.args[1]) == "") or (
            proc is not None and flags & _AT_SYMLINK_FOLLOW
        ):
            self._linked_fd(call, proc)
            return
        follow = bool(flags & _AT_SYMLINK_FOLLOW)
        self._hard_linked(
            call, (call.args[0], call.args[1]), (call.args[2], call.args[3]), follow=follow
        )

    def _linked_fd(self, call: Call, proc: re.Match[str] | None) -> None:
        """linkat of an open file by its descriptor (``AT_EMPTY_PATH``, or the
        ``/proc/self/fd/N`` of open(2)'s O_TMPFILE example): the descriptor's file gets
        the new name (an O_TMPFILE file its first)."""
        if proc is not None and proc[1] not in ("self", "thread-self", str(call.tid)):
            self._refuse(call, f"a link of another process's descriptor ({proc[0]})")
            return
        opened = self._table(call.tid).get(int(proc[2])) if proc else self._file(call)
        dst = self._where(call, call.args[2], call.args[3])
        inside = opened is not None and opened.inode is not None
        if dst is None or not inside:
            if dst is not None or inside:
                said = "a file outside the audited tree" if dst else "a name outside the tree"
                self._refuse(call, f"a descriptor's file hard-linked to {said}", dst and dst[3])
            return
        assert opened is not None
        assert opened.inode is not None
        self._inode_names[opened.inode] = dst[3]
        self._op("entry", dst[0], f"linkat {opened.path} -> {dst[3]}", ((dst[1], opened.inode),))

    def _symlinked(self, call: Call, target: str, nd: str | None, new: str) -> None:
        dst = self._where(call, nd, new)
        if dst is None:
            return
        text = unescape(target)
        at = self._path_of(dst[0])
        if at is None or resolve(model_lookup(self.inodes), self._bases(), at, text) is None:
            self._refuse(
                call,
                f"a symlink out of the audited tree ({dst[3]} -> {text}): the check would "
                "read the live target in every crash state",
                dst[3],
            )
            return
        inode = self._new("symlink", None)
        self.inodes[inode].base_data = self.inodes[inode].data = os.fsencode(text)
        self._inode_names[inode] = dst[3]
        self._op("entry", dst[0], f"{call.name} {dst[3]} -> {text}", ((dst[1], inode),))

    def _sys_symlink(self, call: Call) -> None:
        self._symlinked(call, call.args[0], None, call.args[1])

    def _sys_symlinkat(self, call: Call) -> None:
        self._symlinked(call, call.args[0], call.args[1], call.args[2])

    def _sys_bind(self, call: Call) -> None:
        """A Unix socket bound at a path makes a socket node there, by no open or mknod
        (audit5 attack 4): refused in the tree, as a FIFO is (an abstract name, ``@"..."``,
        makes none)."""
        m = _SUN_PATH.search(call.args[1]) if len(call.args) > 1 else None
        if m is None:
            return
        where = self._where(call, None, m[1])
        if where is not None:
            self._refuse(
                call,
                f"a Unix socket bound at {where[3]}: the crash states hold regular files, "
                "directories and symlinks only",
                where[3],
            )
