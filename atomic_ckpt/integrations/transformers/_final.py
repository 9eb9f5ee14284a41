"""The saves outside a checkpoint (a script's final ``save_model``), each file durable,
and what starting ``train`` does first: the resume keyword, the cleanup of killed saves."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from atomic_ckpt import MARKER, TMP_INFIX, InsideCheckpointError, parse_step
from atomic_ckpt._core.l1_names.errors import disk_full, wrap_os_error
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt.integrations.transformers._resume import (
    CHECKPOINT_PREFIX,
    _barrier,
    _checkpoints,
    _clean,
    _distributed,
    _rank,
)
from atomic_ckpt.integrations.transformers._weights import stale_weights

log = logging.getLogger(__package__ or __name__)

FINAL_STAGING = "final-model"
"""The staging directory of a final ``save_model`` (hidden: ``.tmp-final-model.<hex>``)."""


@contextlib.contextmanager
def _final_save(
    output_dir: str, *, durable: bool, collective: bool = True, weights: bool = False
) -> Iterator[str]:
    """A staging directory in ``output_dir`` (one for every rank, made by rank 0) whose
    files, once the block has written them on every rank, rank 0 moves to the same paths
    in ``output_dir``, each atomically and durably; the staging directory is then gone.
    ``collective=False``: rank 0 alone calls it (``save_state``, ``save_metrics``, and
    ``save_model`` where stock's is not collective). ``weights=True`` (a model save): then
    the weight files of an earlier save it makes stale are removed (:func:`stale_weights`),
    durably, once the new ones are durably in place.

    Every file stays in the staging directory, which its lock marks as a live save, until
    the rename that puts it in place: a kill at any point leaves nothing outside it, and
    the next start's ``clean()`` removes it (an ``atomic_write`` beside each target left a
    ``.<name>.tmp-<hex>`` no clean could tell from another process's live write); so does
    the next final save into the same directory, which need not be ``output_dir``. A full
    disk (or quota) is a :class:`~atomic_ckpt.DiskFullError`, as in a commit. Aimed at a
    committed checkpoint or inside one: :func:`refuse_inside_checkpoint`, on every rank
    that calls it (each sees the same tree), before anything is written or cleaned."""
    refuse_inside_checkpoint(output_dir, "this final save")
    with (
        _disk_full_said(output_dir),
        _staged(output_dir, durable=durable, collective=collective, weights=weights) as at,
    ):
        yield at


@contextlib.contextmanager
def _disk_full_said(output_dir: str) -> Iterator[None]:
    """ENOSPC or EDQUOT met in the block (the caller's writes, the staging, the moves)
    raised as the :class:`~atomic_ckpt.DiskFullError` a commit raises, saying what to do,
    from the original error (and with its notes: a cleanup failure stays visible)."""
    try:
        yield
    except OSError as exc:
        full = disk_full(exc, Path(output_dir), f"the final save into {output_dir}")
        if full is None:
            raise
        for note in getattr(exc, "__notes__", ()):
            full.add_note(note)
        raise full from exc


@contextlib.contextmanager
def _staged(output_dir: str, *, durable: bool, collective: bool, weights: bool) -> Iterator[str]:
    """:func:`_final_save` but for its errors' wording."""
    handle = None
    if _rank() == 0:
        ckpts = _checkpoints(output_dir, durable=durable)
        # What a killed final save left here first: a train() start cleans only
        # args.output_dir, never the directory of save_model(output_dir=...).
        _clean(ckpts)
        handle = ckpts.begin_named(FINAL_STAGING)
    staging = [str(handle.path) if handle is not None else ""]
    if collective and _distributed():
        dist.broadcast_object_list(staging, src=0)
    failed: BaseException | None = None
    try:
        try:
            yield staging[0]
        except BaseException as exc:
            failed = exc
        if collective:
            _barrier()  # every rank has written (or failed) before rank 0 moves anything
        if failed is not None:
            raise failed
        if handle is not None:
            # The directory itself, not a link to it (``out -> /scratch/run``): its fsync
            # opens it without following links.
            target = handle.path.parent
            moved = _move_into(handle.path, target, durable=durable)
            if weights:
                _remove_stale_weights(target, moved, durable=durable)
    finally:
        if handle is not None:
            handle.abort(failed)


def committed_checkpoint_of(path: str | os.PathLike[str]) -> Path | None:
    """The committed checkpoint that ``path`` is or lies inside, or None: the nearest
    directory at or above it (links resolved: a link to ``checkpoint-2`` is it) that holds
    the marker and whose name is no temporary (a staging directory or an old copy)."""
    here = Path(os.path.realpath(path))
    for directory in (here, *here.parents):
        if TMP_INFIX not in directory.name and os.path.isfile(directory / MARKER):
            return directory
    return None


def refuse_inside_checkpoint(path: str | os.PathLike[str], what: str, fix: str = "") -> None:
    """:class:`~atomic_ckpt.InsideCheckpointError` if ``path`` is, or is inside, a committed
    checkpoint, which ``what`` would change in place (files renamed over its committed
    ones, a checkpoint-M or a staging directory made inside it, its temporaries cleaned).
    ``fix``: what to do instead, first in the message."""
    ckpt = committed_checkpoint_of(path)
    if ckpt is None:
        return
    step = parse_step(ckpt.name, CHECKPOINT_PREFIX)
    prefix = CHECKPOINT_PREFIX if step is not None else ""
    if step is None:
        step = parse_step(ckpt.name, "")
    where = "" if Path(os.path.realpath(path)) == ckpt else "inside "
    amend = (
        f"CheckpointDir({str(ckpt.parent)!r}, prefix={prefix!r}).amend({step})"
        if step is not None
        else "CheckpointDir.amend"
    )
    raise InsideCheckpointError(
        f"{path} is {where}the committed checkpoint {ckpt}, and {what} would write into "
        "it: a committed checkpoint is never changed in place (its files must stay the "
        f"ones its manifest lists). {fix}Save to a directory outside every checkpoint, "
        f"such as the run directory {ckpt.parent} that holds it; to change the "
        f"checkpoint itself, make the change a new commit of it with {amend}. Nothing "
        "was written",
        path=ckpt,
        step=step,
    )


def _refuse_run_inside_checkpoint(output_dir: str) -> None:
    """A ``train()`` start: :func:`refuse_inside_checkpoint` for the run's ``output_dir``,
    where every checkpoint-M commit and final save of the run would go."""
    refuse_inside_checkpoint(
        output_dir,
        "this run (its checkpoints and final saves)",
        "Set output_dir to another directory (to resume from this checkpoint, pass it "
        "as resume_from_checkpoint only). ",
    )


def _save_metrics(
    output_dir: str, split: str, metrics: dict[str, Any], *, combined: bool, durable: bool
) -> None:
    """``Trainer.save_metrics``'s files, each replaced atomically and durably:
    ``<split>_results.json``, and (``combined``) ``all_results.json`` updated with
    ``metrics``. A torn ``all_results.json`` would make the next call fail to read it."""
    files = {f"{split}_results.json": metrics}
    if combined:
        path = os.path.join(output_dir, "all_results.json")
        every: dict[str, Any] = {}
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                every = json.load(f)
        every.update(metrics)
        files["all_results.json"] = every
    with _final_save(output_dir, durable=durable, collective=False) as staging:
        for name, obj in files.items():
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                json.dump(obj, f, indent=4, sort_keys=True)


def _move_into(staging: Path, output_dir: Path, *, durable: bool) -> list[str]:
    """Every regular file below ``staging`` renamed over its path in ``output_dir``: each
    fsynced, renamed straight from the staging directory, and (once all are) each
    directory it went into fsynced; links and other entries refused rather than followed.
    Returns the relative paths moved.

    In sorted order, which puts a sharded model's shards (``model-00001-of-00002...``)
    before its index (``model.safetensors.index.json``): the index that names them
    appears only once they are all in place."""
    directories: dict[Path, None] = {}
    entries = sorted(_files_below(staging))
    for entry in entries:
        source, target = staging / entry, output_dir / entry
        try:
            created = _fs.makedirs(target.parent)
            if durable:
                for made in created:
                    _fs.fsync_dir(made.parent)
                _fs.fsync_file(source)  # the data, before the name can point at it
            _fs.rename(source, target)
        except OSError as exc:
            wrapped = wrap_os_error(exc, output_dir)
            if wrapped is not exc:
                raise wrapped from exc
            raise
        directories[target.parent] = None
    if durable:
        for directory in directories:
            _fs.fsync_dir(directory)  # the renames, durably
    return entries


def _remove_stale_weights(output_dir: Path, moved: list[str], *, durable: bool) -> None:
    """The weight files in ``output_dir`` that the model just moved there makes stale,
    removed (after the new files are durable: a crash in between leaves an older whole
    model loadable, never none), then the directory fsynced; a crash before that leaves
    them to the next final save there, which removes them the same way."""
    present = [p.name for p in output_dir.iterdir() if p.is_file() and not p.is_symlink()]
    stale = stale_weights(moved, present)
    for name in stale:
        log.info("removing %s: weights of an earlier save, stale beside the new ones", name)
        try:
            _fs.unlink(output_dir / name)
        except FileNotFoundError:
            continue
    if stale and durable:
        _fs.fsync_dir(output_dir)


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
