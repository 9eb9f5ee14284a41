"""Verified resumes that read each byte once, however the checkpoint is named; last_checkpoint.

Chosen by ``resume_from_checkpoint=True``, taken from :func:`last_checkpoint` with
``verify=True``, or passed as a path (issue 30 item 23): the files a rank loads are hashed
through mappings that are then held while Trainer loads them by path, so its reads are
served from the very pages hashed."""

from __future__ import annotations

import os
from pathlib import Path

import torch.distributed as dist

from atomic_ckpt import CheckpointDir, VerificationError, parse_step
from atomic_ckpt._core.l3_formats import verify as _verify
from atomic_ckpt.distributed import resume, resume_verified
from atomic_ckpt.integrations.transformers._resume import (
    CHECKPOINT_PREFIX,
    _checkpoints,
    _clean,
    _distributed,
    _loaded_by,
    _rank,
)


class _VerifiedPath(str):
    """A checkpoint's path (a plain ``str`` to any other code) that carries the mappings its
    files were verified through, for ``AtomicTrainer.train`` to load from: what
    ``last_checkpoint(verify=True)`` returns. The mappings go with the string (or when
    ``train`` takes them)."""

    views: dict[str, memoryview]

    def take(self) -> dict[str, memoryview]:
        """The views, handed over once (the string then carries none)."""
        views, self.views = self.views, {}
        return views


def _with_views(path: Path, views: dict[str, memoryview]) -> _VerifiedPath:
    out = _VerifiedPath(str(path))
    out.views = views
    return out


def verified_latest(ckpts: CheckpointDir) -> _VerifiedPath | None:
    """The newest checkpoint that verifies, with the views of the files this rank loads
    (collective with several ranks: rank 0 chooses, each rank hashes what it loads)."""
    # The files of the newest checkpoint this rank loads (the one verified, unless it fails
    # and an older one, saved by the same Trainer, is taken); every rank lists the root.
    newest = ckpts.latest()
    names = [] if newest is None else _loaded_by(newest, _rank(), _distributed())
    found = resume_verified(ckpts, names)  # one process: ckpts.resume_verified(names)
    if found is None:
        return None
    return _with_views(found.checkpoint.path, dict(found.files))


def verified_path(path: str | os.PathLike[str]) -> _VerifiedPath:
    """``path`` (a ``checkpoint-N`` of an atomic_ckpt output directory) verified, with the
    views of the files this rank loads. VerificationError if it does not verify (a path
    chosen by the caller is never swapped for another); ValueError if it is not a
    ``checkpoint-N``; CheckpointNotFoundError if it is not complete. With several ranks it
    is collective: each rank hashes the files it loads, rank 0 the rest and the tree, and
    every rank raises if any part failed."""
    text = os.path.abspath(os.fspath(path))
    step = parse_step(os.path.basename(text), CHECKPOINT_PREFIX)
    if step is None:
        raise ValueError(
            f"verify_on_resume=True cannot verify {path}: it is not a checkpoint-N directory "
            "of an atomic_ckpt output directory (nothing records its files). Resume from it "
            "with verify_on_resume=False, or adopt it first with `atomic-ckpt mark-complete`"
        )
    ckpts = _checkpoints(os.path.dirname(text))
    ckpt = ckpts.get(step)  # its marker read whole, as a verify does
    mine = _loaded_by(ckpt, _rank(), _distributed())
    if not _distributed():
        return _with_views(ckpt.path, _verify.verify(ckpt, workers=ckpts.workers, keep=mine))
    reads: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(reads, sorted(mine))
    problem: str | None = None
    views: dict[str, memoryview] = {}
    try:
        if _rank() == 0:
            others = {p for r, ps in enumerate(reads) if r != 0 for p in ps or ()}
            views = _verify.verify(
                ckpt, workers=ckpts.workers, keep=mine, hashed_elsewhere=others - set(mine)
            )
        else:
            views = _verify.verify(ckpt, workers=ckpts.workers, keep=mine, only=mine)
    except VerificationError as exc:
        problem = "; ".join(exc.problems) or str(exc)
    outcomes: list[str | None] = [None] * dist.get_world_size()
    dist.all_gather_object(outcomes, problem)
    failed = [(r, why) for r, why in enumerate(outcomes) if why is not None]
    if failed:
        views.clear()
        problems = tuple(f"rank {r}: {why}" for r, why in failed)
        raise VerificationError(
            f"checkpoint {ckpt.path} does not verify: {problems[0]}",
            path=ckpt.path,
            step=step,
            problems=problems,
        )
    return _with_views(ckpt.path, views)


def last_checkpoint(
    output_dir: str | os.PathLike[str], *, verify: bool = False, clean: bool = False
) -> str | None:
    """The newest *complete* ``checkpoint-N`` of ``output_dir`` (a path, as
    ``get_last_checkpoint`` returns), or None: what to pass as ``resume_from_checkpoint``.

    ``verify``: the newest whose files match its manifest; the returned string then
    carries the mappings the files this process loads were hashed through, and
    ``AtomicTrainer.train(resume_from_checkpoint=<it>)`` loads from them instead of
    reading the files again: each byte comes from storage once, as with
    ``resume_from_checkpoint=True`` and ``verify_on_resume=True``. (Any other code sees a
    plain ``str``; the mappings are released with it, or when ``train`` takes them.)
    ``clean``: first remove what killed saves left (never a live save). When
    torch.distributed is initialized it is collective, like
    :func:`atomic_ckpt.distributed.resume`: call it on every rank; rank 0 chooses and
    every rank gets its choice (verified, each rank hashes the files it loads). A
    directory of ``checkpoint-N`` written before atomic_ckpt and no complete checkpoint
    raises :class:`~atomic_ckpt.UnmarkedCheckpointsError` (adopt them with
    ``atomic-ckpt mark-complete``).
    """
    ckpts = _checkpoints(output_dir)
    if clean and _rank() == 0:
        _clean(ckpts)
    if verify:
        return verified_latest(ckpts)
    found = resume(ckpts) if _distributed() else ckpts.resume_point()
    return None if found is None else str(found.path)
