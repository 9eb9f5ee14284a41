"""The sharded strategies of :mod:`atomic_ckpt.integrations.lightning`: a checkpoint directory
written by every rank into a staging directory and committed by rank 0, between two barriers.

Imported by the public module after its check that torch and Lightning are installed.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atomic_ckpt import (
    CheckpointDir,
    clean_temporaries,
    commit_directory,
    remove_directory,
    temp_name,
)
from atomic_ckpt._core.l2_syscalls import locks as _locks
from atomic_ckpt.integrations.lightning import _checked
from atomic_ckpt.integrations.lightning._io import _local

if TYPE_CHECKING:
    # Typed against pytorch_lightning (it ships py.typed; the ``lightning`` package does not).
    from pytorch_lightning.strategies import Strategy as _StrategyBase
else:
    _StrategyBase = object

log = logging.getLogger("atomic_ckpt.integrations.lightning")  # the public module's, as _io


class _AtomicShardedSave(_StrategyBase):
    """A sharded strategy whose checkpoint directories are committed atomically.

    Every rank writes its shards into a hidden staging directory beside the final name
    (rank 0 picks it and broadcasts it) and fsyncs the tree; after a barrier rank 0 renames
    it into place (exchanging it with an older one of the same name) and fsyncs the parent;
    a last barrier keeps every rank from going on before that. A crash leaves the old
    checkpoint or the new one under the name, never a partial one. Saves that are one file
    (``state_dict_type="full"``) go through the ``CheckpointIO`` as with any strategy.
    """

    def _saves_directory(self) -> bool:
        return bool(
            getattr(self, "_save_distributed_checkpoint", False)
            or getattr(self, "_state_dict_type", None) == "sharded"
        )

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None
    ) -> None:
        if not self._saves_directory():
            super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
            return
        if self.is_global_zero:
            # What killed saves left beside it (a save by hand outside the ModelCheckpoint
            # dirpath is in no fit's setup): before the broadcast, so no rank has begun
            # this save's staging directory yet; a live write elsewhere is left alone.
            beside = os.path.dirname(os.path.abspath(_local(filepath)))
            for removed in clean_temporaries(beside):
                log.warning("removed %s, left by an interrupted save", removed)
        final = _local(self.broadcast(os.fspath(filepath)))
        name = self.broadcast(temp_name(os.path.basename(final)))
        parent = os.path.dirname(os.path.abspath(final))
        staging = os.path.join(parent, name)
        # The staging directory is a write in progress until it is committed: each rank
        # holds the parent's lock meanwhile, so clean_temporaries (another fit's setup)
        # leaves it alone.
        with _locks.writing_in(Path(parent)):
            try:
                super().save_checkpoint(checkpoint, staging, storage_options=storage_options)
                # Each rank flushes the tree (so what it wrote, wherever the ranks run).
                CheckpointDir(parent, checksum=None).sync_tree(staging, hash=False)
            except BaseException:
                if self.is_global_zero:
                    remove_directory(staging, durable=False)
                raise
            self.barrier("atomic_ckpt: every rank wrote and flushed its shards")
            if self.is_global_zero:
                commit_directory(staging, final)
        self.barrier("atomic_ckpt: the checkpoint directory is in place")

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        """The strategy's load (which reads files itself, never through the
        ``CheckpointIO``); with the IO's ``verify_on_load``, a full-state file is first
        checked against its checksum, and the strategy then loads the very file hashed:
        it is handed ``/proc/self/fd/<n>`` of the descriptor the check opened, never the
        name (which may name another file by now), so its reads are served from the pages
        hashed. A checkpoint directory is refused: its shards are committed without
        checksums; so is a verified load where ``/proc/self/fd`` does not exist."""
        if not getattr(self.checkpoint_io, "verify_on_load", False):
            return super().load_checkpoint(checkpoint_path, *args, **kwargs)
        path = _local(self.broadcast(os.fspath(checkpoint_path)))  # the one every rank loads
        if os.path.isdir(path):
            raise ValueError(
                f"verify_on_load=True cannot verify the sharded checkpoint directory {path}: "
                "its shards are committed without checksums. Load it with "
                "verify_on_load=False (the commit still makes it atomic and durable)"
            )
        if not os.path.isdir("/proc/self/fd"):
            raise ValueError(
                f"verify_on_load=True cannot load {path} through {type(self).__name__} here: "
                "the strategy reads the file by a path, and without /proc/self/fd no path "
                "is known to lead to the bytes verified. Load it with verify_on_load=False"
            )
        path = os.path.realpath(path)  # a link the user made (last.ckpt): its target
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            # Every rank checks the file it loads, through the descriptor it then loads.
            with _checked.verified(path, fd=fd):
                # The path was broadcast above; each rank's descriptor is its own, so the
                # strategy's own broadcast of the path is skipped for this call.
                self.broadcast = _as_is  # type: ignore[method-assign]
                try:
                    return super().load_checkpoint(f"/proc/self/fd/{fd}", *args, **kwargs)
                finally:
                    del self.broadcast
        finally:
            os.close(fd)

    def teardown(self) -> None:
        super().teardown()
        # ModelParallelStrategy.teardown (2.6.6) does not call Strategy.teardown, so the
        # CheckpointIO's teardown never ran: deletes and links still queued were lost at
        # exit. Running it twice (other strategies do call it) is harmless.
        self.checkpoint_io.teardown()


def _as_is(obj: Any, src: int = 0) -> Any:
    """``Strategy.broadcast`` for a value every rank already holds: itself."""
    return obj
