"""The :class:`~atomic_ckpt.CheckpointDir` methods a training loop needs beyond commit:
the open commit of a step, amending a committed checkpoint, named checkpoints."""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

from atomic_ckpt._core.l1_names.names import step_of
from atomic_ckpt._core.l3_formats.read import Checkpoint
from atomic_ckpt._core.l4_protocol import amend as _amend
from atomic_ckpt._core.l4_protocol import begin as _begin
from atomic_ckpt._core.l4_protocol import carry as _carry
from atomic_ckpt._core.l4_protocol import commit as _commit
from atomic_ckpt._core.l4_protocol import dedup as _dedup
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import joining as _joining
from atomic_ckpt._core.l4_protocol import named as _named
from atomic_ckpt._core.l4_protocol.named import NamedCheckpoint
from atomic_ckpt._core.l4_protocol.root import Root, check_step


class TrainerOps:
    """Mixed into :class:`~atomic_ckpt.CheckpointDir`; see its documentation."""

    _root: Root

    def staging(self, step: SupportsIndex | str) -> Path | None:
        """The staging directory of this process's open commit of ``step`` (or of the named
        checkpoint ``step``, a string that is not a step), or None.

        For a save spread over several functions: each finds where to write from
        the step alone, without passing the commit around (or joins it:
        ``commit(step, join=True)``). :meth:`dir_of` falls back to the committed
        directory. A step may be given as ``ls`` shows it (``"5"``, or
        ``"checkpoint-5"`` with that prefix), as everywhere a step or a name is taken.
        """
        commit = _joining.open_commit(self._root, self._target(step)[1])
        return None if commit is None else commit.path

    def dir_of(self, step: SupportsIndex | str) -> Path:
        """Where ``step``'s files are now: the staging directory of this process's open
        commit of ``step`` (or of the named checkpoint ``step``), else its committed
        directory; CheckpointNotFoundError if neither is there.

        ``staging(step) or path_of(step)`` for steps and names alike, without a path that
        holds nothing: a part saved, or read back, by a function that may run inside the
        save of its step or after it.
        """
        number, name = self._target(step)
        commit = _joining.open_commit(self._root, name)
        if commit is not None:
            staged: Path = commit.path
            return staged
        if number is None:
            return _named.get(self._root, name).path
        return _delete.require_complete(self._root, number).path

    def _target(self, step: SupportsIndex | str) -> tuple[int | None, str]:
        """(step, directory name) of a step, a step's name (``"5"``, or ``"checkpoint-5"``
        in a ``checkpoint-`` root: both as ``ls`` shows it), or a checkpoint name (step
        None; the name checked). No checkpoint name is a step name, so none is ambiguous."""
        if isinstance(step, str):
            number = step_of(step, self._root.prefix)
            if number is None:
                return None, _named.check_name(self._root, step)
            step = number
        number = check_step(step)
        return number, self._root.name_of(number)

    @contextlib.contextmanager
    def amend(
        self,
        step: SupportsIndex,
        *,
        metadata: Mapping[str, Any] | None = None,
        remove: Collection[str] = (),
    ) -> Iterator[Path]:
        """Change a committed checkpoint: yields an empty staging directory.

        Files written there are added (or replace the committed ones of the same
        path); paths in ``remove`` (files or directories) are dropped; every other
        committed file is carried over unchanged (a hard link, or a copy where the
        filesystem refuses links; its manifest entry is reused, not re-hashed);
        ``metadata`` is merged into the manifest's. The result replaces the step
        atomically and durably, like a commit. With no files and nothing removed,
        only the marker is rewritten: one small durable write.
        """
        with _amend.amend(self._root, step, metadata=metadata, remove=remove) as path:
            yield path

    # ------------------------------------------------------------------ named checkpoints

    def begin_named(
        self,
        name: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        aliases: Collection[str] = (),
        replace_aliases: bool = False,
        replace_unusable: bool = False,
        dedup: bool | int | str = False,
    ) -> _commit.Commit:
        """:meth:`begin` for a named checkpoint: the handle's ``finish()`` (or leaving it as
        a context manager) commits ``root/<name>/``; ``abort()`` gives it up. ``dedup=True``
        compares with the newest complete step (see :meth:`commit`)."""
        return _begin.begin_as(
            self._root,
            None,
            _named.check_name(self._root, name),
            metadata=metadata,
            aliases=aliases,
            replace_aliases=replace_aliases,
            replace_unusable=replace_unusable,
            dedup=dedup,
        )

    @contextlib.contextmanager
    def commit_named(
        self,
        name: str,
        *,
        metadata: Mapping[str, Any] | None = None,
        aliases: Collection[str] = (),
        replace_aliases: bool = False,
        join: bool = False,
        carry: Mapping[str, int | str] | None = None,
        replace_unusable: bool = False,
        dedup: bool | int | str = False,
    ) -> Iterator[Path]:
        """Commit a named checkpoint (``root/<name>/``, e.g. ``interrupted``) with the same
        protocol as a step. ``latest()`` and ``steps()`` never count it. ``aliases``,
        ``replace_aliases``, ``join``, ``carry``, ``replace_unusable`` and ``dedup`` as for
        :meth:`~atomic_ckpt.CheckpointDir.commit` (a join with nothing open over a committed
        ``name`` is refused the same way)."""
        if join:
            checked = _named.check_name(self._root, name)
            outer = _joining.find_join(self._root, checked, None)
            if outer is not None:
                options = {"metadata": metadata, "aliases": aliases}
                with _joining.joined(outer, replace_aliases=replace_aliases, **options) as path:
                    _carry.carry_all(outer, carry)
                    _dedup.join(outer, _dedup.check(dedup, self._root))
                    yield path
                return
            _joining.refuse_rejoin(self._root.path / checked, None)
        handle = self.begin_named(
            name,
            metadata=metadata,
            aliases=aliases,
            replace_aliases=replace_aliases,
            replace_unusable=replace_unusable,
            dedup=dedup,
        )
        handle.as_block()
        try:
            _carry.carry_all(handle, carry)
            yield handle.path
        except BaseException as exc:
            handle.abort(exc)
            handle._raise_disk_full(exc)
            raise
        handle.finish()

    def get_named(self, name: str) -> NamedCheckpoint:
        """The complete named checkpoint ``name``; CheckpointNotFoundError if there is none."""
        return _named.get(self._root, name)

    def named(self) -> list[NamedCheckpoint]:
        """Every complete named checkpoint, by name."""
        return _named.listing(self._root)

    def promote_named(
        self, name: str, step: SupportsIndex, *, replace_unusable: bool = False
    ) -> Checkpoint:
        """Turn the named checkpoint ``name`` into step ``step``, atomically and durably.

        Its manifest is rewritten to record the step, then it is renamed (replacing
        an existing step the way a commit does, and refusing, as a commit does, to
        replace one a newer atomic_ckpt wrote or one moved there by hand unless
        ``replace_unusable=True``). The supported form of ``mv name N``.
        """
        return _named.promote(self._root, name, check_step(step), replace_unusable=replace_unusable)
