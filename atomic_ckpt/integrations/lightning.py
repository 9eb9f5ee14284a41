"""PyTorch Lightning: atomic, durable ``.ckpt`` files, an atomic ``last`` link, a safe async save.

::

    from lightning.pytorch import Trainer
    from atomic_ckpt.integrations.lightning import AtomicCheckpointIO, AtomicModelCheckpoint

    trainer = Trainer(
        plugins=[AtomicCheckpointIO(async_save=True)],
        callbacks=[AtomicModelCheckpoint(dirpath="ckpts", save_top_k=2, save_last="link")],
    )
    trainer.fit(model, ckpt_path="last")

* :class:`AtomicCheckpointIO` (a ``CheckpointIO`` plugin) writes each checkpoint to a hidden
  temporary file beside its final name, fsyncs it, renames it over the name and fsyncs the
  directory (:func:`atomic_ckpt.atomic_write`): a crash leaves the old file or the new one,
  never a torn one. Deletes are durable; loading uses ``weights_only=True`` unless the
  caller (``trainer.fit(..., weights_only=False)``) says otherwise.
* ``AtomicCheckpointIO(async_save=True)``: the training loop does not wait for the write.
  Saves, deletes and ``last`` links run in the order Lightning asked for them, on one
  background thread, so a delete or a link made after a save waits until that save is
  durable, and an older save never overwrites a newer one. An error in the background is
  raised by the next call (and nothing queued behind the failed operation runs: no delete
  goes ahead on behalf of a save that failed); ``teardown`` (the end of ``fit``) waits.
  Lightning's own ``AsyncCheckpointIO`` wrapped around a plain ``AtomicCheckpointIO``
  cannot give this order: it queues saves but runs deletes on the caller's thread, so the
  previous best file is deleted before the new one exists. :class:`AtomicModelCheckpoint`
  refuses that combination with a hint.
* :class:`AtomicModelCheckpoint` (a ``ModelCheckpoint``) replaces the ``last`` symlink
  atomically (a new link renamed over the old one: ``last`` is never absent, and never
  names a file that is not yet durable), deletes a top-k file that ``last`` still names
  only after ``last`` has moved on, and at setup removes the temporary files of saves a
  crash interrupted (:func:`atomic_ckpt.clean_temporaries`).

``lightning`` (``lightning.pytorch``) and ``pytorch-lightning`` (``pytorch_lightning``) are
separate packages with separate base classes. The names above are built for ``lightning``
when it is installed, else for ``pytorch_lightning``; :func:`classes_for` builds them for
either (``classes_for("pytorch_lightning").AtomicCheckpointIO``, and so on).

Sharded strategies write a checkpoint *directory* from every rank and bypass
``CheckpointIO``: use :class:`AtomicModelParallelStrategy` or :class:`AtomicFSDPStrategy`
(the same arguments as Lightning's). Every rank writes into a hidden staging directory
and flushes it; rank 0 then renames it into place (:func:`atomic_ckpt.commit_directory`),
between two barriers. ModelParallelStrategy (FSDP2) is tested on CPU with 2 gloo ranks;
FSDPStrategy (FSDP1) is built the same way but untested (torch refuses FSDP1 without an
accelerator); DeepSpeed is not covered.
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from atomic_ckpt import (
    CheckpointDir,
    atomic_write,
    clean_temporaries,
    commit_directory,
    remove_directory,
    replace_symlink,
    temp_name,
)

try:
    import torch
    from lightning_utilities.core.apply_func import apply_to_collection
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "atomic_ckpt.integrations.lightning needs Lightning: pip install 'atomic_ckpt[lightning]'"
    ) from _exc

if TYPE_CHECKING:
    # Typed against pytorch_lightning (it ships py.typed; the ``lightning`` package does not).
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO as _CheckpointIOBase
    from pytorch_lightning import Trainer
    from pytorch_lightning.callbacks import ModelCheckpoint as _ModelCheckpointBase
    from pytorch_lightning.strategies import Strategy as _StrategyBase
else:
    _CheckpointIOBase = object
    _ModelCheckpointBase = object
    _StrategyBase = object

__all__ = [
    "TESTED_VERSIONS",
    "AtomicCheckpointIO",
    "AtomicFSDPStrategy",
    "AtomicModelCheckpoint",
    "AtomicModelParallelStrategy",
    "LightningClasses",
    "classes_for",
]

log = logging.getLogger(__name__)

Package = Literal["lightning", "pytorch_lightning"]

TESTED_VERSIONS = ((2, 6), (2, 7))
"""The Lightning releases this module is tested with: >= 2.6, < 2.7."""

OVERRIDDEN_PRIVATE = {
    "ModelCheckpoint": (
        "_link_checkpoint",  # staticmethod (trainer, filepath, linkpath): the atomic link
        "_remove_checkpoint",  # (trainer, filepath): defer deleting the file `last` names
        "_save_last_checkpoint",  # (trainer, monitor_candidates): then run deferred deletes
    ),
}
"""Lightning's private methods this module overrides, by class (checked at import)."""

READ_PRIVATE = {
    "ModelCheckpoint": ("_last_checkpoint_saved",),  # the file `last` is to link to
    "ModelParallelStrategy": ("_save_distributed_checkpoint",),  # True: saves a directory
    "FSDPStrategy": ("_state_dict_type",),  # "sharded": saves a directory
}
"""Lightning's private attributes this module reads, by class (set in each ``__init__``)."""


def _default_map_location(storage: Any, location: Any) -> Any:
    return storage


class _AtomicCheckpointIO(_CheckpointIOBase):
    """A ``CheckpointIO`` that saves each ``.ckpt`` atomically and durably.

    ``async_save=True`` writes in a background thread, in order (see the module's
    docstring). ``durable=False`` skips the fsyncs: still atomic against a crash of the
    process, not against a power loss.
    """

    def __init__(self, *, async_save: bool = False, durable: bool = True) -> None:
        super().__init__()
        self.async_save = async_save
        self.durable = durable
        self._executor: ThreadPoolExecutor | None = None
        self._queued: list[Future[None]] = []
        self._error: BaseException | None = None
        self._skipped: list[str] = []
        self._state = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(async_save={self.async_save}, durable={self.durable})"

    def __getstate__(self) -> dict[str, Any]:
        # A spawned trainer pickles its plugins: nothing may be in flight then.
        self.wait()
        state = self.__dict__.copy()
        state.update(_executor=None, _queued=[], _state=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._state = threading.Lock()

    # ------------------------------------------------------------ CheckpointIO

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically and durably (queued if async)."""
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes no storage_options "
                f"(got {storage_options!r})"
            )
        target = _local(path)
        if self.async_save:
            # Copy the tensors now, on the caller's thread: training goes on changing them.
            checkpoint = apply_to_collection(checkpoint, torch.Tensor, _snapshot)
        self._run(self._save_now, checkpoint, target, what=f"save {target}")

    def remove_checkpoint(self, path: Any) -> None:
        """Delete ``path`` (a file, or a sharded checkpoint's directory) durably, after every
        save queued before it (missing is fine)."""
        target = _local(path)
        self._run(self._remove_now, target, what=f"remove {target}")

    def load_checkpoint(
        self,
        path: Any,
        map_location: Any | None = _default_map_location,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load ``path`` (after every queued save), with ``weights_only=True`` by default."""
        self.wait()
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        loaded: dict[str, Any] = torch.load(
            path,
            map_location=map_location,
            weights_only=True if weights_only is None else weights_only,
        )
        return loaded

    def teardown(self) -> None:
        """Wait for every queued operation, stop the background thread, raise its error."""
        try:
            self.wait()
        finally:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True)

    # ------------------------------------------------------------ beyond CheckpointIO

    def link(self, filepath: Any, linkpath: Any) -> None:
        """Point the symlink ``linkpath`` at ``filepath`` atomically, after every queued save.

        The link is relative (it survives moving the directory). The target must exist
        when the link is made: a link never dangles.
        """
        target, link = _local(filepath), _local(linkpath)
        self._run(self._link_now, target, link, what=f"link {link} -> {target}")

    def wait(self) -> None:
        """Block until every queued operation is done (durable); raise a background error."""
        for future in list(self._queued):
            future.result()
        self._queued = [f for f in self._queued if not f.done()]
        self._raise_pending()

    # ------------------------------------------------------------ internals

    def _save_now(self, checkpoint: dict[str, Any], path: str) -> None:
        with atomic_write(path, durable=self.durable, parents=True) as tmp:
            torch.save(checkpoint, tmp)

    def _remove_now(self, path: str) -> None:
        # A sharded checkpoint is a directory: it disappears at once, then is removed.
        remove_directory(path, durable=self.durable)

    def _link_now(self, filepath: str, linkpath: str) -> None:
        if not os.path.exists(filepath):
            raise FileNotFoundError(
                f"cannot link {linkpath} to {filepath}: it does not exist (a link never dangles)"
            )
        relative = os.path.relpath(filepath, os.path.dirname(os.path.abspath(linkpath)))
        replace_symlink(relative, linkpath, durable=self.durable)

    def _run(self, job: Callable[..., None], *args: Any, what: str) -> None:
        self._raise_pending()
        if not self.async_save:
            job(*args)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="atomic_ckpt-lightning")
        self._queued = [f for f in self._queued if not f.done()]
        self._queued.append(self._executor.submit(self._background, job, args, what))

    def _background(self, job: Callable[..., None], args: tuple[Any, ...], what: str) -> None:
        with self._state:
            if self._error is not None:
                # Something queued before this failed: run nothing that may depend on it
                # (a delete of the file a failed save was to replace, say).
                self._skipped.append(what)
                return
        try:
            job(*args)
        except BaseException as exc:
            with self._state:
                self._error = exc

    def _raise_pending(self) -> None:
        with self._state:
            failed = self._error is not None
        if not failed:
            return
        # Let what is still queued see the failure (and skip) before reporting it.
        for future in list(self._queued):
            future.result()
        self._queued = []
        with self._state:
            error, self._error = self._error, None
            skipped, self._skipped = self._skipped, []
        assert error is not None
        if skipped:
            error.add_note("atomic_ckpt: not done because of this error: " + "; ".join(skipped))
            log.warning("background checkpoint error; skipped: %s", "; ".join(skipped))
        raise error


def _local(path: Any) -> str:
    """``path`` as a local path; a URL (``s3://...``) is refused: the commit is a local rename."""
    text: str = os.fspath(path)
    if "://" in text:
        raise ValueError(
            f"AtomicCheckpointIO writes local files only, not {text!r}: use Lightning's "
            "TorchCheckpointIO for object storage"
        )
    return text


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


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
        final = _local(self.broadcast(os.fspath(filepath)))
        name = self.broadcast(temp_name(os.path.basename(final)))
        parent = os.path.dirname(os.path.abspath(final))
        staging = os.path.join(parent, name)
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

    def teardown(self) -> None:
        super().teardown()
        # ModelParallelStrategy.teardown (2.6.6) does not call Strategy.teardown, so the
        # CheckpointIO's teardown never ran: deletes and links still queued were lost at
        # exit. Running it twice (other strategies do call it) is harmless.
        self.checkpoint_io.teardown()


class LightningClasses(NamedTuple):
    """The plugin, the callback and the sharded strategies, built for one Lightning package."""

    AtomicCheckpointIO: type[_AtomicCheckpointIO]
    AtomicModelCheckpoint: type[_AtomicModelCheckpoint]
    AtomicModelParallelStrategy: type[_AtomicShardedSave]
    AtomicFSDPStrategy: type[_AtomicShardedSave]


_BUILT: dict[str, LightningClasses] = {}


def _tested(version: str) -> bool:
    from packaging.version import Version

    v = Version(version).release
    return TESTED_VERSIONS[0] <= v[:2] < TESTED_VERSIONS[1]


def classes_for(package: Package) -> LightningClasses:
    """``AtomicCheckpointIO`` and ``AtomicModelCheckpoint`` for ``package``: ``"lightning"``
    (``lightning.pytorch``) or ``"pytorch_lightning"``.

    Raises ImportError if it is not installed or not a tested version.
    """
    if package in _BUILT:
        return _BUILT[package]
    if package not in ("lightning", "pytorch_lightning"):
        raise ValueError(f"package must be 'lightning' or 'pytorch_lightning', not {package!r}")
    pl, fabric = (
        ("lightning.pytorch", "lightning.fabric")
        if package == "lightning"
        else ("pytorch_lightning", "lightning_fabric")
    )
    try:
        root = importlib.import_module(package)
        io_base = importlib.import_module(f"{fabric}.plugins.io.checkpoint_io").CheckpointIO
        mc_base = importlib.import_module(f"{pl}.callbacks").ModelCheckpoint
        strategies = importlib.import_module(f"{pl}.strategies")
    except ImportError as exc:
        raise ImportError(
            f"atomic_ckpt.integrations.lightning needs {package}: "
            "pip install 'atomic_ckpt[lightning]'"
        ) from exc
    version = str(getattr(root, "__version__", "0"))
    lo, hi = (".".join(map(str, v)) for v in TESTED_VERSIONS)
    if not _tested(version):
        raise ImportError(
            f"atomic_ckpt.integrations.lightning is tested with {package} >={lo},<{hi}, and "
            f"{version} is installed: it overrides private methods that may have changed. "
            f"Install a tested release: pip install 'atomic_ckpt[lightning]'"
        )
    missing = [
        f"ModelCheckpoint.{name}"
        for name in OVERRIDDEN_PRIVATE["ModelCheckpoint"]
        if not callable(getattr(mc_base, name, None))
    ]
    if missing:
        raise ImportError(f"{package} {version} lacks {', '.join(missing)}: not supported")
    suffix = "" if package == _DEFAULT else f"_{package}"
    io_cls = _make(f"AtomicCheckpointIO{suffix}", _AtomicCheckpointIO, io_base)
    mc_cls = _make(f"AtomicModelCheckpoint{suffix}", _AtomicModelCheckpoint, mc_base)
    mp_cls = _make(
        f"AtomicModelParallelStrategy{suffix}", _AtomicShardedSave, strategies.ModelParallelStrategy
    )
    fsdp_cls = _make(f"AtomicFSDPStrategy{suffix}", _AtomicShardedSave, strategies.FSDPStrategy)
    built = _BUILT[package] = LightningClasses(io_cls, mc_cls, mp_cls, fsdp_cls)
    return built


def _make(name: str, impl: type[Any], base: type[Any]) -> type[Any]:
    cls = type(name, (impl, base), {"__module__": __name__, "__doc__": impl.__doc__})
    cls.__qualname__ = name
    globals()[name] = cls  # so that pickle (a spawned trainer) finds it
    return cls


def _default_package() -> Package:
    for package in ("lightning", "pytorch_lightning"):
        try:
            importlib.import_module(package)
        except ImportError:
            continue
        return package
    raise ImportError(
        "atomic_ckpt.integrations.lightning needs Lightning: pip install 'atomic_ckpt[lightning]'"
    )


_DEFAULT: Package = _default_package()
AtomicCheckpointIO, AtomicModelCheckpoint, AtomicModelParallelStrategy, AtomicFSDPStrategy = (
    classes_for(_DEFAULT)
)
