"""Accelerate: ``Accelerator.save_state`` inside one atomic, durable (multi-process) commit.

::

    from accelerate import Accelerator
    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.integrations.accelerate import load_state, save_state

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(my_stateful_object)
    ckpts = CheckpointDir("run/checkpoints", prefix="checkpoint_")

    start = load_state(accelerator, ckpts) or 0      # on every process; None: fresh start
    skipped = accelerator.skip_first_batches(loader, start % len(loader))
    ...
    save_state(accelerator, ckpts, step)             # on every process

Everything ``accelerator.save_state`` writes (models, optimizers, schedulers, the sampler
and dataloader state, the GradScaler, the RNG state of every process, and the objects
registered with ``register_for_checkpointing``) is written into one staging directory and
appears as ``<root>/checkpoint_<step>/`` in one atomic, durable step; with several
processes through :func:`atomic_ckpt.distributed.distributed_commit` (every process
writes, rank 0 alone promotes once all succeeded). :func:`load_state` resumes from the
newest *complete* checkpoint, chosen by rank 0 for every process, and restores
``ProjectConfiguration.iteration`` (which ``Accelerator.load_state`` leaves behind).

This replaces ``ProjectConfiguration(automatic_checkpoint_naming=True, total_limit=k)``:
the step is the name (no counter to drift), ``retain=RetentionPolicy(keep_last=k)`` deletes
old checkpoints durably and only complete ones, and resuming never picks a directory a
killed save left behind. Automatic naming is switched off for the duration of each call
(with it on, ``Accelerator.save_state`` ignores its ``output_dir``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, SupportsIndex

try:
    import accelerate  # type: ignore[import-untyped]
    import torch.distributed as dist
    from accelerate import Accelerator
except ImportError as _exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"atomic_ckpt.integrations.accelerate needs accelerate ({_exc}): "
        "pip install 'atomic_ckpt[accelerate]'"
    ) from _exc

from atomic_ckpt import Checkpoint, CheckpointDir, RetentionPolicy
from atomic_ckpt.distributed import distributed_commit, resume
from atomic_ckpt.integrations._versions import TestedRange, warn_if_untested

__all__ = ["ITERATION_KEY", "TESTED_RANGE", "load_state", "save_state"]

TESTED_RANGE = TestedRange("accelerate", "1.1.0", "1.15.0")
"""The Accelerate versions CI runs this module's tests with, the oldest and the newest.

Only public API is used (``save_state``/``load_state`` and ``ProjectConfiguration``'s
``automatic_checkpoint_naming``, ``iteration`` and ``save_on_each_node``, the same since
0.34), so the oldest is the oldest that passes the tests: with 1.0 a run resumed by
:func:`load_state` does not train on bit-identically. Outside the range the import warns
(:class:`~atomic_ckpt.integrations.UntestedVersionWarning`)."""

warn_if_untested(__name__, TESTED_RANGE, accelerate.__version__)

ITERATION_KEY = "accelerate_iteration"
"""Manifest metadata key: ``ProjectConfiguration.iteration`` after the save."""


def _several(accelerator: Accelerator) -> bool:
    return accelerator.num_processes > 1 and dist.is_available() and dist.is_initialized()


def _check_shared(accelerator: Accelerator) -> None:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", accelerator.num_processes))
    if accelerator.project_configuration.save_on_each_node and local < accelerator.num_processes:
        raise ValueError(
            "save_on_each_node=True across several nodes writes node-local copies, which "
            "rank 0 cannot commit: save to a filesystem every process shares"
        )


@contextlib.contextmanager
def _manual_naming(accelerator: Accelerator) -> Iterator[None]:
    config = accelerator.project_configuration
    automatic = config.automatic_checkpoint_naming
    config.automatic_checkpoint_naming = False
    try:
        yield
    finally:
        config.automatic_checkpoint_naming = automatic


def save_state(
    accelerator: Accelerator,
    ckpts: CheckpointDir,
    step: SupportsIndex,
    *,
    metadata: Mapping[str, Any] | None = None,
    retain: RetentionPolicy | None = None,
    replace_unusable: bool = False,
    **kwargs: Any,
) -> Path:
    """``accelerator.save_state()`` committed as ``step`` of ``ckpts``; call it on every
    process. Returns the checkpoint's path once it is durable (on every process).

    ``metadata`` goes into the manifest (rank 0's), ``retain`` is applied once the commit is
    durable, ``replace_unusable`` is as for ``CheckpointDir.commit`` (a checkpoint a newer
    release wrote, or one moved to the step's name by hand, is refused unless it is given),
    other keyword arguments go to ``Accelerator.save_state``. If any process
    raises, every process raises and nothing is promoted.
    """
    _check_shared(accelerator)
    config = accelerator.project_configuration
    meta = {**(metadata or {}), ITERATION_KEY: config.iteration + 1}
    commit: contextlib.AbstractContextManager[Path]
    if _several(accelerator):
        commit = distributed_commit(
            ckpts, step, metadata=meta, retain=retain, replace_unusable=replace_unusable
        )
    else:
        commit = ckpts.commit(step, metadata=meta, retain=retain, replace_unusable=replace_unusable)
    with _manual_naming(accelerator), commit as path:
        accelerator.save_state(str(path), **kwargs)
    return ckpts.path_of(step)


def load_state(
    accelerator: Accelerator,
    ckpts: CheckpointDir,
    *,
    step: SupportsIndex | None = None,
    verify: bool = False,
    **kwargs: Any,
) -> int | None:
    """Load the newest complete checkpoint of ``ckpts`` (or ``step``'s) into ``accelerator``;
    call it on every process. Returns the step loaded, or None when there is nothing to
    resume from (a fresh start).

    Rank 0 first removes what killed saves left (never a live save), then chooses, and
    every process loads its choice. ``verify``: the newest checkpoint whose files match its
    manifest (or, with ``step``, raise VerificationError if that one does not). Restores
    ``project_configuration.iteration``. Other keyword arguments go to
    ``Accelerator.load_state``.
    """
    ckpt: Checkpoint | None
    if step is not None:
        ckpt = ckpts.verify(step) if verify else ckpts.get(step)
    elif _several(accelerator):
        if dist.get_rank() == 0:
            ckpts.clean()
        ckpt = resume(ckpts, verify=verify)
    else:
        ckpts.clean()
        ckpt = ckpts.resume_point(verify=verify)
    if ckpt is None:
        return None
    with _manual_naming(accelerator):
        accelerator.load_state(str(ckpt.path), **kwargs)
    iteration = ckpt.manifest.metadata.get(ITERATION_KEY)
    if isinstance(iteration, int) and not isinstance(iteration, bool):
        accelerator.project_configuration.iteration = iteration
    return ckpt.step
