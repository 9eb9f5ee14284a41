"""The saves outside a checkpoint (a script's final ``save_model``), each file durable,
and what starting ``train`` does first: the resume keyword, the cleanup of killed saves."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from atomic_ckpt import atomic_write
from atomic_ckpt.integrations.transformers._resume import (
    _barrier,
    _checkpoints,
    _clean,
    _distributed,
    _rank,
)

FINAL_STAGING = "final-model"
"""The staging directory of a final ``save_model`` (hidden: ``.tmp-final-model.<hex>``)."""


@contextlib.contextmanager
def _final_save(output_dir: str, *, durable: bool) -> Iterator[str]:
    """A staging directory in ``output_dir`` (one for every rank, made by rank 0) whose
    files, once the block has written them on every rank, rank 0 moves to the same paths
    in ``output_dir``, each atomically and durably; the staging directory is then gone."""
    handle = None
    if _rank() == 0:
        handle = _checkpoints(output_dir, durable=durable).begin_named(FINAL_STAGING)
    staging = [str(handle.path) if handle is not None else ""]
    if _distributed():
        dist.broadcast_object_list(staging, src=0)
    failed: BaseException | None = None
    try:
        try:
            yield staging[0]
        except BaseException as exc:
            failed = exc
        _barrier()  # every rank has written (or failed) before rank 0 moves anything
        if failed is not None:
            raise failed
        if handle is not None:
            _move_into(handle.path, Path(output_dir), durable=durable)
    finally:
        if handle is not None:
            handle.abort(failed)


def _save_metrics(
    output_dir: str, split: str, metrics: dict[str, Any], *, combined: bool, durable: bool
) -> None:
    """``Trainer.save_metrics``'s files, each replaced atomically and durably:
    ``<split>_results.json``, and (``combined``) ``all_results.json`` updated with
    ``metrics``. A torn ``all_results.json`` would make the next call fail to read it."""
    _write_json(os.path.join(output_dir, f"{split}_results.json"), metrics, durable=durable)
    if combined:
        path = os.path.join(output_dir, "all_results.json")
        every: dict[str, Any] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                every = json.load(f)
        every.update(metrics)
        _write_json(path, every, durable=durable)


def _write_json(path: str, obj: dict[str, Any], *, durable: bool) -> None:
    with (
        atomic_write(path, durable=durable, parents=True) as tmp,
        open(tmp, "w", encoding="utf-8") as f,
    ):
        json.dump(obj, f, indent=4, sort_keys=True)


def _move_into(staging: Path, output_dir: Path, *, durable: bool) -> None:
    """Every regular file below ``staging`` renamed over its path in ``output_dir`` with
    :func:`~atomic_ckpt.atomic_write` (fsync, rename, fsync the directory); links and
    other entries refused rather than followed."""
    for entry in sorted(_files_below(staging)):
        with atomic_write(output_dir / entry, durable=durable, parents=True) as tmp:
            os.replace(staging / entry, tmp)


def _files_below(top: Path) -> Iterator[str]:
    """The relative paths of the regular files below ``top`` (never through a link)."""
    for dirpath, dirnames, filenames in os.walk(top):
        here = Path(dirpath)
        for name in [*filenames, *(d for d in dirnames if (here / d).is_symlink())]:
            path = here / name
            if path.is_symlink() or not path.is_file():
                raise FileExistsError(
                    f"{path}: the final save wrote a link or a special file; atomic_ckpt "
                    "moves regular files only"
                )
            yield str(path.relative_to(top))


_LATEST_WORDS = frozenset({"true", "latest"})
"""The strings ``train(resume_from_checkpoint=...)`` takes for the automatic resume."""


def _means_latest(resume_from_checkpoint: str | bool | None) -> bool:
    """Whether ``resume_from_checkpoint`` asks for the newest complete checkpoint: True, or
    ``"true"``/``"latest"`` in any case (an example script's string argument) when no
    directory of that name exists."""
    if isinstance(resume_from_checkpoint, bool):
        return resume_from_checkpoint
    if not isinstance(resume_from_checkpoint, str):
        return False
    word = resume_from_checkpoint.strip().lower()
    return word in _LATEST_WORDS and not os.path.isdir(resume_from_checkpoint)


def _clean_if_present(output_dir: str) -> None:
    """What killed saves left in ``output_dir``, removed (if it is a directory at all)."""
    if os.path.isdir(output_dir):
        _clean(_checkpoints(output_dir))
