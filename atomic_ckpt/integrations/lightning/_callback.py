"""The ``ModelCheckpoint`` callback of :mod:`atomic_ckpt.integrations.lightning`: an atomic
``last`` link that never dangles, top-k deletes deferred until ``last`` has moved on, and the
clean-up of interrupted saves at setup.

Imported by the public module after its check that torch and Lightning are installed.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from atomic_ckpt import clean_temporaries, replace_symlink
from atomic_ckpt.integrations.lightning._io import _AtomicCheckpointIO

if TYPE_CHECKING:
    # Typed against pytorch_lightning (it ships py.typed; the ``lightning`` package does not).
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint as _ModelCheckpointBase
else:
    _ModelCheckpointBase = object

log = logging.getLogger("atomic_ckpt.integrations.lightning")  # the public module's, as before


def _checkpoint_io_chain(trainer: Trainer) -> list[Any]:
    """The trainer's CheckpointIO and every IO it wraps (Lightning's wrappers)."""
    chain: list[Any] = []
    io: Any = trainer.strategy.checkpoint_io
    while io is not None and io not in chain:
        chain.append(io)
        io = getattr(io, "checkpoint_io", None)
    return chain


class _AtomicModelCheckpoint(_ModelCheckpointBase):
    """A ``ModelCheckpoint`` whose ``last`` link is replaced atomically and never dangles.

    Takes every argument of ``ModelCheckpoint``. With :class:`AtomicCheckpointIO` as the
    trainer's plugin the link is made by it, in order with the saves (also when they are
    asynchronous); without it, the link is still replaced atomically and durably.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._link_targets: dict[str, str] = {}
        self._deferred: list[str] = []

    def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath is not None:
            # The temporary files of saves a crash interrupted (Lightning allows one trainer
            # per directory, and this one has not started saving).
            for path in clean_temporaries(self.dirpath):
                log.info("removed %s, left by an interrupted save", path)
        for io in _checkpoint_io_chain(trainer):
            if type(io).__name__ == "AsyncCheckpointIO" and not isinstance(io, _AtomicCheckpointIO):
                raise ValueError(
                    f"{type(self).__name__} cannot keep its order with Lightning's "
                    "AsyncCheckpointIO, which queues saves but deletes and links at once "
                    "(the previous checkpoint can go before the new one exists). Use "
                    "plugins=[AtomicCheckpointIO(async_save=True)] instead"
                )

    @staticmethod
    def _link_checkpoint(trainer: Trainer, filepath: str, linkpath: str) -> None:
        if trainer.is_global_zero and os.path.abspath(filepath) != os.path.abspath(linkpath):
            ios = [
                io for io in _checkpoint_io_chain(trainer) if isinstance(io, _AtomicCheckpointIO)
            ]
            if ios:
                ios[0].link(filepath, linkpath)
            else:
                relative = os.path.relpath(filepath, os.path.dirname(os.path.abspath(linkpath)))
                replace_symlink(relative, linkpath)
        trainer.strategy.barrier()

    def _save_last_checkpoint(self, trainer: Trainer, monitor_candidates: dict[str, Any]) -> None:
        # Lightning's own condition for linking instead of saving a copy.
        links = bool(
            self.save_last == "link" and self._last_checkpoint_saved and self.save_top_k != 0
        )
        target = self._last_checkpoint_saved
        super()._save_last_checkpoint(trainer, monitor_candidates)
        if self.save_last and self.last_model_path:
            if links:
                self._link_targets[self.last_model_path] = target
            else:
                self._link_targets.pop(self.last_model_path, None)
        deferred, self._deferred = self._deferred, []
        for path in deferred:
            self._remove_checkpoint(trainer, path)

    def _remove_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        if self._named_by_last(filepath):
            # `last` still names it: delete it once `last` has moved on (at the end of
            # the next _save_last_checkpoint), never leave `last` dangling.
            self._deferred.append(filepath)
            return
        super()._remove_checkpoint(trainer, filepath)

    def _named_by_last(self, filepath: str) -> bool:
        last = self.last_model_path
        if self.save_last != "link" or not last:
            return False
        target = self._link_targets.get(last)
        if target is None:  # not linked in this run yet: what the disk says
            try:
                target = os.path.join(os.path.dirname(last), os.readlink(last))
            except OSError:
                return False
        return os.path.abspath(target) == os.path.abspath(filepath)
