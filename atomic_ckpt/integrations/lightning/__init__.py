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
* Each file :class:`AtomicCheckpointIO` saves carries the checksum of its bytes (in its zip
  comment: still a plain ``torch.save`` file). ``AtomicCheckpointIO(verify_on_load=True)``
  checks it before a load and loads from the very pages hashed (each byte read from storage
  once while the file fits in the page cache); a file that does not match or carries no
  checksum is refused with a :class:`~atomic_ckpt.VerificationError` naming it.
* ``AtomicCheckpointIO(async_save=True)``: the training loop does not wait for the write.
  Saves, deletes and ``last`` links run in the order Lightning asked for them, on one
  background thread, so a delete or a link made after a save waits until that save is
  durable, and an older save never overwrites a newer one. An error in the background is
  logged at ERROR as it happens (by the rank it happened on) and raised by the next call
  (and nothing queued behind the failed operation runs: no delete goes ahead on behalf of
  a save that failed); ``teardown`` (the end of ``fit``) waits and raises it, so ``fit``
  never ends as if a failed save had been written.
  Lightning's own ``AsyncCheckpointIO`` wrapped around a plain ``AtomicCheckpointIO``
  cannot give this order: it queues saves but runs deletes on the caller's thread, so the
  previous best file is deleted before the new one exists. :class:`AtomicModelCheckpoint`
  refuses that combination with a hint.
  The stock ``ModelCheckpoint(save_last="link")`` links ``last`` on the caller's thread, to
  a file still queued: ``AtomicCheckpointIO(async_save=True)`` refuses it (ValueError
  naming :class:`AtomicModelCheckpoint`) before its first save, or the load of a resumed fit.
* :class:`AtomicModelCheckpoint` (a ``ModelCheckpoint``) replaces the ``last`` symlink
  atomically (a new link renamed over the old one: ``last`` is never absent, and never
  names a file that is not yet durable), deletes a top-k file that ``last`` still names
  only after ``last`` has moved on, and when a fit sets up removes the temporary files of
  saves a crash interrupted (:func:`atomic_ckpt.clean_temporaries`); a validate, test or
  predict run leaves the directory alone (it may run beside a training still saving there).
  Everything else is ``ModelCheckpoint``'s: the signature, and the state in a checkpoint,
  filed under ``ModelCheckpoint``'s key (a run can switch to or from it and resume its best
  and top-k bookkeeping).

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

import dataclasses
import importlib
from typing import Any, Literal, NamedTuple

from atomic_ckpt._core.l1_names import public as _public

# Checked here, with a hint, before anything needs them (the private modules below use them).
try:
    import torch  # noqa: F401
    from lightning_utilities.core.apply_func import apply_to_collection  # noqa: F401
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "atomic_ckpt.integrations.lightning needs Lightning: pip install 'atomic_ckpt[lightning]'"
    ) from _exc

# The implementations, imported only now that torch and Lightning are known to be there (so a
# missing one gives the hint above): the plugin in _lightning_io, the callback in
# _lightning_callback, the sharded strategies in _lightning_strategy. Each is a mixin without
# a Lightning base; classes_for() below builds the public classes from them, per package.
from atomic_ckpt.integrations._versions import TestedRange, warn_if_untested
from atomic_ckpt.integrations.lightning._callback import _AtomicModelCheckpoint
from atomic_ckpt.integrations.lightning._io import _AtomicCheckpointIO
from atomic_ckpt.integrations.lightning._strategy import _AtomicShardedSave

__all__ = [
    "TESTED_RANGE",
    "TESTED_VERSIONS",
    "AtomicCheckpointIO",
    "AtomicFSDPStrategy",
    "AtomicModelCheckpoint",
    "AtomicModelParallelStrategy",
    "LightningClasses",
    "classes_for",
]

Package = Literal["lightning", "pytorch_lightning"]

TESTED_RANGE = TestedRange("lightning", "2.3.0", "2.6.6")
"""The Lightning versions CI runs this module's tests with (``lightning`` and
``pytorch-lightning`` alike), the oldest and the newest.

2.3 is the oldest: ``ModelParallelStrategy`` (which :class:`AtomicModelParallelStrategy`
extends) first appears in it; ``save_last="link"`` is 2.2's, ``_link_checkpoint`` 2.1's.
Outside the range the import warns (:class:`~atomic_ckpt.integrations.UntestedVersionWarning`)."""

TESTED_VERSIONS = (
    tuple(int(p) for p in TESTED_RANGE.oldest.split(".")[:2]),
    (int(TESTED_RANGE.newest.split(".")[0]), int(TESTED_RANGE.newest.split(".")[1]) + 1),
)
""":data:`TESTED_RANGE` as ``(major, minor)`` bounds, from the first, below the second:
``((2, 3), (2, 7))``. Kept for code written against 0.2.0.dev0; use :data:`TESTED_RANGE`."""

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


class LightningClasses(NamedTuple):
    """The plugin, the callback and the sharded strategies, built for one Lightning package."""

    AtomicCheckpointIO: type[_AtomicCheckpointIO]
    AtomicModelCheckpoint: type[_AtomicModelCheckpoint]
    AtomicModelParallelStrategy: type[_AtomicShardedSave]
    AtomicFSDPStrategy: type[_AtomicShardedSave]


_BUILT: dict[str, LightningClasses] = {}


def classes_for(package: Package) -> LightningClasses:
    """``AtomicCheckpointIO`` and ``AtomicModelCheckpoint`` for ``package``: ``"lightning"``
    (``lightning.pytorch``) or ``"pytorch_lightning"``.

    Raises ImportError if it is not installed or lacks a method of
    :data:`OVERRIDDEN_PRIVATE`; warns if its version is outside :data:`TESTED_RANGE`
    (:class:`~atomic_ckpt.integrations.UntestedVersionWarning`).
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
    missing = [
        f"ModelCheckpoint.{name}"
        for name in OVERRIDDEN_PRIVATE["ModelCheckpoint"]
        if not callable(getattr(mc_base, name, None))
    ]
    missing += [
        f"strategies.{name}"
        for name in ("ModelParallelStrategy", "FSDPStrategy")
        if not hasattr(strategies, name)
    ]
    if missing:
        raise ImportError(
            f"{package} {version} lacks {', '.join(missing)}: not supported "
            f"(tested: {TESTED_RANGE})"
        )
    private = [f"{cls}.{name}" for cls, names in OVERRIDDEN_PRIVATE.items() for name in names]
    private += [f"{cls}.{name}" for cls, names in READ_PRIVATE.items() for name in names]
    tested = dataclasses.replace(TESTED_RANGE, package=package.replace("_", "-"))
    warn_if_untested(__name__, tested, version, private)
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

_public.export(__name__, globals(), __all__)
