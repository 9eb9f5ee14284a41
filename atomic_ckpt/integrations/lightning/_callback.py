"""The ``ModelCheckpoint`` callback of :mod:`atomic_ckpt.integrations.lightning`: an atomic
``last`` link that never dangles, top-k deletes deferred until ``last`` has moved on, and the
clean-up of interrupted saves at setup.

Imported by the public module after its check that torch and Lightning are installed.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from atomic_ckpt import clean_temporaries
from atomic_ckpt.integrations.lightning._io import _AtomicCheckpointIO
from atomic_ckpt.integrations.lightning._links import _replace_link

if TYPE_CHECKING:
    # Typed against pytorch_lightning (it ships py.typed; the ``lightning`` package does not).
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint as _ModelCheckpointBase
else:
    _ModelCheckpointBase = object

log = logging.getLogger("atomic_ckpt.integrations.lightning")  # the public module's, as before

MAX_IO_DEPTH = 16
"""How many CheckpointIOs a trainer's chain may hold (Lightning's have one or two)."""


def _checkpoint_io_chain(trainer: Trainer) -> list[Any]:
    """The trainer's CheckpointIO and every IO it wraps (Lightning's wrappers).

    At most :data:`MAX_IO_DEPTH` of them: a longer chain is no Lightning trainer's. A
    ``Mock()`` trainer (every attribute a new Mock) was walked forever; now its first
    ones are returned, none of which is an IO this module knows, so the callback acts as
    without :class:`AtomicCheckpointIO`, as the stock one does with such a trainer
    (Lightning's own tests link with a ``Mock()`` trainer)."""
    chain: list[Any] = []
    io: Any = trainer.strategy.checkpoint_io
    while io is not None and io not in chain:
        if len(chain) == MAX_IO_DEPTH:
            log.warning(
                "trainer.strategy.checkpoint_io wraps more than %d CheckpointIOs (%s, ...): "
                "not a Lightning Trainer's chain (a Mock trainer?); only the first %d are "
                "looked at",
                MAX_IO_DEPTH,
                ", ".join(type(i).__name__ for i in chain[:3]),
                MAX_IO_DEPTH,
            )
            break
        chain.append(io)
        io = getattr(io, "checkpoint_io", None)
    return chain


@dataclass
class _Links:
    """What an ``AtomicModelCheckpoint`` knows of its ``last`` links in this run."""

    targets: dict[str, str] = field(default_factory=dict)
    """Each ``last`` path linked in this run, and the file it names."""
    deferred: list[str] = field(default_factory=list)
    """Top-k files to delete once ``last`` no longer names them."""


class _AtomicModelCheckpoint(_ModelCheckpointBase):
    """A ``ModelCheckpoint`` whose ``last`` link is replaced atomically and never dangles.

    Takes every argument of ``ModelCheckpoint`` (its ``__init__`` is ``ModelCheckpoint``'s:
    this class has none, so the signature tools see is the real one). With
    :class:`AtomicCheckpointIO` as the trainer's plugin the link is made by it, in order
    with the saves (also when they are asynchronous); without it, the link is still
    replaced atomically and durably.

    Its state in a checkpoint is ``ModelCheckpoint``'s, under ``ModelCheckpoint``'s key:
    a run may switch between the two and resume with its best and top-k bookkeeping.
    """

    _links_through_io = True
    """Read by :class:`AtomicCheckpointIO` (async): this callback's ``last`` links are
    queued with the saves, so they are safe (the stock callback's are refused)."""

    @property
    def state_key(self) -> str:
        """``ModelCheckpoint``'s key for the same arguments (Lightning embeds the class
        name): the state is interchangeable with the stock callback's. A subclass of
        this one has its own name in its key, as a subclass of ``ModelCheckpoint`` has."""
        key: str = super().state_key
        cls = type(self)
        if cls.__bases__[0] is _AtomicModelCheckpoint:  # the public class, built on the stock one
            stock, own = cls.__bases__[1].__qualname__, cls.__qualname__
            if key.startswith(own):
                key = stock + key[len(own) :]
        return key

    @property
    def _links(self) -> _Links:
        # Made on first use, not in an __init__ of ours (see the class docstring).
        links: _Links | None = self.__dict__.get("_atomic_links")
        if links is None:
            links = self.__dict__["_atomic_links"] = _Links()
        return links

    def setup(self, trainer: Trainer, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if trainer.is_global_zero and self.dirpath is not None and stage == "fit":
            # The temporary files of saves a crash interrupted. Only a fit owns the
            # directory (Lightning allows one fit per directory, and this one has not
            # started saving); a validate, test or predict run may be an evaluation beside
            # a training that is still saving there, so it leaves the directory alone. A
            # fit beside another training's save in progress removes nothing either
            # (clean_temporaries sees the directory lock every write holds).
            for path in clean_temporaries(self.dirpath):
                log.warning("removed %s, left by an interrupted save", path)
        chain = _checkpoint_io_chain(trainer)
        ours = any(isinstance(io, _AtomicCheckpointIO) for io in chain)
        if trainer.is_global_zero and stage == "fit" and not ours:
            log.warning(
                "%s: the trainer's CheckpointIO is %s, not AtomicCheckpointIO: its saves "
                "(and trainer.save_checkpoint) are not atomic or durable, only the `last` "
                "link is. Add plugins=[AtomicCheckpointIO()] to the Trainer",
                type(self).__name__,
                type(chain[0]).__name__ if chain else None,
            )
        for io in chain:
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
                _replace_link(relative, linkpath, durable=True)
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
                self._links.targets[self.last_model_path] = target
            else:
                self._links.targets.pop(self.last_model_path, None)
        deferred, self._links.deferred = self._links.deferred, []
        for path in deferred:
            self._remove_checkpoint(trainer, path)

    def _remove_checkpoint(self, trainer: Trainer, filepath: str) -> None:
        if self._named_by_last(filepath):
            # `last` still names it: delete it once `last` has moved on (at the end of
            # the next _save_last_checkpoint), never leave `last` dangling.
            self._links.deferred.append(filepath)
            return
        super()._remove_checkpoint(trainer, filepath)

    def _named_by_last(self, filepath: str) -> bool:
        last = self.last_model_path
        if self.save_last != "link" or not last:
            return False
        target = self._links.targets.get(last)
        if target is None:  # not linked in this run yet: what the disk says
            try:
                target = os.path.join(os.path.dirname(last), os.readlink(last))
            except OSError:
                return False
        return os.path.abspath(target) == os.path.abspath(filepath)
