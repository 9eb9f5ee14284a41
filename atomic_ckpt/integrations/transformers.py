"""Hugging Face ``Trainer``: every checkpoint committed atomically and durably, on every rank.

::

    from atomic_ckpt.integrations.transformers import AtomicTrainer, last_checkpoint

    trainer = AtomicTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    trainer.train(resume_from_checkpoint=True)   # the newest *complete* checkpoint

    class MySFTTrainer(AtomicCheckpointMixin, SFTTrainer):  # the mixin first
        pass

What changes, and nothing else does (names, layout and files stay Hugging Face's):

* Every checkpoint ``Trainer`` saves (model, optimizer, scheduler, scaler, the RNG state of
  every rank, ``trainer_state.json``, the tokenizer or processor) is written into one
  staging directory and appears as ``output_dir/checkpoint-N/`` in one atomic, durable
  step (:class:`~atomic_ckpt.CheckpointDir` with ``prefix="checkpoint-"``). With several
  ranks this is :func:`atomic_ckpt.distributed.distributed_commit`: rank 0 names the
  staging directory, every rank writes into it, and rank 0 alone promotes it once every
  rank has succeeded. A save killed at any point leaves ``checkpoint-N`` absent (or, when
  the step existed, its previous complete copy), never half written.
* Rotation (``save_total_limit``, and the best checkpoint ``load_best_model_at_end`` keeps)
  is the library's retention: durable deletes of complete checkpoints only, never a live
  staging directory; the best one is named by the ``checkpoint_best`` symlink and kept.
  ``Trainer``'s own rotation only ever sees the staging directory, and its end-of-training
  deletion with ``save_total_limit=1`` (by name, with ``rmtree``: a kill midway left a
  marked, half-deleted directory) is switched off and done durably instead.
* ``train(resume_from_checkpoint=True)`` resumes from the newest *complete* checkpoint
  (verified against its manifest with ``verify_on_resume=True``, and then loaded from the
  pages the verification read: each byte from storage once, see
  :class:`AtomicCheckpointMixin`), chosen by rank 0 for
  every rank, after removing what killed saves left (``CheckpointDir.clean()``: never a
  live save of another process). :func:`last_checkpoint` is the same choice for scripts,
  in place of ``transformers.trainer_utils.get_last_checkpoint`` (which returns any
  directory whose name matches, finished or not).

The private ``Trainer`` methods this relies on are listed in :data:`PRIVATE_METHODS` and
checked when this module is imported: a missing one, or one whose parameters changed, is
refused; a transformers version outside :data:`TESTED_RANGE` (4.47.0 to 5.24.x) only warns.

* ``push_to_hub=True`` uploads what a plain ``Trainer`` uploads, for every ``hub_strategy``,
  but only once the checkpoint is committed: the checkpoint pushes read the committed
  ``checkpoint-N`` (its manifest included), and no upload ever takes an entry of the
  library's own (staging directories, locks: every name containing ``.tmp-``, see
  :data:`HUB_IGNORE_PATTERNS`), which Trainer's ``_*`` and ``checkpoint-*`` patterns do
  not match.

Not supported: ``save_on_each_node=True`` on several nodes (node-local storage: no rank 0
can promote another node's files; refused; on one node it is the default's behaviour).
FSDP and DeepSpeed saves go through the same commit (every rank writes into the staging
directory) but are untested here: they need GPUs.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

try:
    import torch.distributed as dist
    import transformers
    import transformers.trainer as _trainer_module
    from transformers import Trainer
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput
except ImportError as _exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"atomic_ckpt.integrations.transformers needs transformers ({_exc}): "
        "pip install 'atomic_ckpt[transformers]'"
    ) from _exc

from atomic_ckpt import TMP_INFIX, Checkpoint, CheckpointDir, CheckpointNotFoundError, parse_step
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt.distributed import distributed_commit, resume, resume_verified
from atomic_ckpt.integrations._versions import TestedRange, warn_if_untested

__all__ = [
    "CHECKPOINT_PREFIX",
    "HUB_IGNORE_PATTERNS",
    "PRIVATE_METHODS",
    "TESTED_RANGE",
    "AtomicCheckpointMixin",
    "AtomicTrainer",
    "check_transformers",
    "last_checkpoint",
]

log = logging.getLogger(__name__)

TESTED_RANGE = TestedRange("transformers", "4.47.0", "5.24.0")
"""The transformers versions CI runs this module's tests with, the oldest and the newest.

4.47 is the oldest: ``Trainer._save_checkpoint`` took a third parameter (``metrics``)
before it. Outside the range the import warns
(:class:`~atomic_ckpt.integrations.UntestedVersionWarning`)."""

PRIVATE_METHODS: dict[str, tuple[str, ...]] = {
    # Overridden: the whole checkpoint save, wrapped in one commit.
    "_save_checkpoint": ("self", "model", "trial"),
    # Redirected during _save_checkpoint: the run directory, so that its
    # "<run dir>/checkpoint-N" lands in the staging directory.
    "_get_output_dir": ("self", "trial"),
    # Deferred during _save_checkpoint (Trainer pushes from inside the save, while the
    # files are in the staging dir) and called once the commit is done; and made to
    # leave the library's temporary entries out of its uploads (see HUB_IGNORE_PATTERNS).
    "_push_from_checkpoint": ("self", "checkpoint_folder"),
    # Wrapped (super(), then release): the loads of a verified resume, after each of which
    # the mappings of the files it read are released (see AtomicCheckpointMixin).
    "_load_from_checkpoint": ("self", "resume_from_checkpoint", "model"),
    "_load_optimizer_and_scheduler": ("self", "checkpoint"),
    "_load_rng_state": ("self", "checkpoint"),
}
"""Every private ``Trainer`` method this module overrides or redirects, with its parameters.

The one place they are named; :func:`check_transformers` compares them with the installed
``Trainer`` at import. (``train`` is overridden too, but it is public.)"""

HUB_IGNORE_PATTERNS = (f"*{TMP_INFIX}*",)
"""Added to the ``ignore_patterns`` of every upload Trainer makes (beside its own ``_*`` and
``checkpoint-*``): the library's staging, aside and lock entries, which are never part of a
checkpoint (their names, and only theirs, contain ``.tmp-``; a plain Trainer's output
directory holds none). ``*`` matches across ``/``, so nothing inside them goes either."""

CHECKPOINT_PREFIX = f"{PREFIX_CHECKPOINT_DIR}-"
"""``checkpoint-``: the step directories are Hugging Face's ``checkpoint-N``."""

_OPTIMIZER_FILES = ("optimizer", "scheduler")
"""What ``Trainer._load_optimizer_and_scheduler`` reads: ``optimizer.pt``, ``scheduler.pt``
(and the ``optimizer*`` of FSDP), by the start of their names."""
_LATE_FILES = ("rng_state", "scaler", "trainer_state")
"""What Trainer reads after the optimizer (``trainer_state.json``, twice, ``scaler.pt``)
or at the first step (``rng_state*.pth``), by the start of their names."""


def _read_with(name: str) -> str:
    """Which of Trainer's resume loads reads the checkpoint file ``name``: ``"optimizer"``,
    ``"late"`` (RNG, scaler, trainer state) or ``"model"`` (everything else: the weights,
    ``config.json``, adapters; files Trainer never reads go with them)."""
    base = name.rsplit("/", 1)[-1]
    if base.startswith(_OPTIMIZER_FILES):
        return "optimizer"
    if base.startswith(_LATE_FILES):
        return "late"
    return "model"


def _loaded_by(checkpoint: Checkpoint, rank: int, distributed: bool) -> list[str]:
    """The files of ``checkpoint`` Trainer loads on ``rank``: all but the other ranks' RNG
    states (``rng_state_<r>.pth``, one per process of a multi-process run)."""
    names = [e.path for e in checkpoint.manifest.files if e.type == "file"]
    if not distributed:
        return names
    mine = f"rng_state_{rank}.pth"
    return [n for n in names if not (n.startswith("rng_state_") and n != mine)]


def check_transformers(version: str, trainer: type[Any] = Trainer) -> bool:
    """Check the installed transformers at import: warn
    (:class:`~atomic_ckpt.integrations.UntestedVersionWarning`, returning True) if
    ``version`` is outside :data:`TESTED_RANGE`; raise ImportError if
    ``trainer`` lacks a method of :data:`PRIVATE_METHODS` or its parameters differ (the
    override would fail at the first save)."""
    for name, params in PRIVATE_METHODS.items():
        method = getattr(trainer, name, None)
        found = None if method is None else tuple(inspect.signature(method).parameters)
        if found != params:
            raise ImportError(
                f"atomic_ckpt.integrations.transformers: transformers {version}'s "
                f"Trainer.{name} is {'missing' if found is None else found}, expected "
                f"{params}; this version is not supported (tested: {TESTED_RANGE})"
            )
    return warn_if_untested(
        __name__, TESTED_RANGE, version, [f"Trainer.{name}" for name in PRIVATE_METHODS]
    )


check_transformers(transformers.__version__)
_HF_API = "hf_api"
"""The function of ``transformers.trainer`` every Hub call of Trainer goes through (5.x)."""
_UPLOAD_FOLDER = "upload_folder"
"""Before ``hf_api`` (4.x): the ``huggingface_hub.upload_folder`` the trainer module imports."""
if callable(getattr(_trainer_module, _HF_API, None)):
    _SEAM = _HF_API
elif callable(getattr(_trainer_module, _UPLOAD_FOLDER, None)):
    _SEAM = _UPLOAD_FOLDER
else:  # the seam of _hub_uploads
    raise ImportError(
        f"atomic_ckpt.integrations.transformers: transformers {transformers.__version__}'s "
        "trainer module has neither hf_api() nor upload_folder(), which its Hub uploads "
        "went through; this version is not supported"
    )


def _ignoring(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``upload_folder`` keyword arguments that also ignore :data:`HUB_IGNORE_PATTERNS`."""
    ignore = kwargs.get("ignore_patterns")
    ignore = [] if ignore is None else [ignore] if isinstance(ignore, str) else list(ignore)
    return {**kwargs, "ignore_patterns": [*ignore, *HUB_IGNORE_PATTERNS]}


class _Uploads:
    """An ``HfApi`` whose ``upload_folder`` also ignores :data:`HUB_IGNORE_PATTERNS`."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def upload_folder(self, **kwargs: Any) -> Any:
        return self._api.upload_folder(**_ignoring(kwargs))


class _UploadsApi:
    """What ``transformers.trainer.hf_api`` is while a push of ours runs."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __call__(self) -> _Uploads:
        return _Uploads(self.real())


class _UploadFolder:
    """What ``transformers.trainer.upload_folder`` is (4.x) while a push of ours runs."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real(*args, **_ignoring(kwargs))


@contextlib.contextmanager
def _hub_uploads() -> Iterator[None]:
    """Trainer's Hub calls, with the library's temporary entries left out of its uploads.

    Trainer calls ``hf_api().upload_folder(...)`` (4.x: ``upload_folder(...)``) with fixed
    ignore patterns; the call itself is synchronous (an upload ``run_as_future`` gets its
    arguments here), so the swap lasts only for the push that makes it."""
    real = getattr(_trainer_module, _SEAM)
    if isinstance(real, _UploadsApi | _UploadFolder):  # already inside one
        yield
        return
    wrapper = _UploadsApi(real) if _SEAM == _HF_API else _UploadFolder(real)
    setattr(_trainer_module, _SEAM, wrapper)
    try:
        yield
    finally:
        setattr(_trainer_module, _SEAM, real)


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _rank() -> int:
    return dist.get_rank() if _distributed() else 0


def _barrier() -> None:
    if _distributed():
        dist.barrier()


def _checkpoints(output_dir: str | os.PathLike[str], *, durable: bool = True) -> CheckpointDir:
    return CheckpointDir(output_dir, prefix=CHECKPOINT_PREFIX, durable=durable)


def last_checkpoint(
    output_dir: str | os.PathLike[str], *, verify: bool = False, clean: bool = False
) -> str | None:
    """The newest *complete* ``checkpoint-N`` of ``output_dir`` (a path, as
    ``get_last_checkpoint`` returns), or None: what to pass as ``resume_from_checkpoint``.

    ``verify``: the newest whose files match its manifest. ``clean``: first remove what
    killed saves left (never a live save). When torch.distributed is initialized it is
    collective, like :func:`atomic_ckpt.distributed.resume`: call it on every rank; rank 0
    chooses and every rank gets its choice. A directory of ``checkpoint-N`` written
    before atomic_ckpt and no complete checkpoint raises
    :class:`~atomic_ckpt.UnmarkedCheckpointsError` (adopt them with ``atomic-ckpt
    mark-complete``).
    """
    ckpts = _checkpoints(output_dir)
    if _distributed():
        if clean and dist.get_rank() == 0:
            _clean(ckpts)
        found = resume(ckpts, verify=verify)
    else:
        if clean:
            _clean(ckpts)
        found = ckpts.resume_point(verify=verify)
    return None if found is None else str(found.path)


def _clean(ckpts: CheckpointDir) -> None:
    try:
        removed = ckpts.clean()
    except OSError as exc:  # resuming matters more; the next clean() retries
        log.warning("could not remove what killed saves left in %s: %s", ckpts.root, exc)
        return
    for path in removed:
        log.info("removed %s, left by a killed save", path)


@contextlib.contextmanager
def _commit(ckpts: CheckpointDir, step: int, metadata: dict[str, Any]) -> Iterator[Path]:
    """One commit of ``step``: multi-rank when several processes run, else local."""
    if _distributed():
        with distributed_commit(ckpts, step, metadata=metadata) as path:
            yield path
    else:
        with ckpts.commit(step, metadata=metadata) as path:
            yield path


if TYPE_CHECKING:
    _Base = Trainer
else:
    _Base = object


class AtomicCheckpointMixin(_Base):
    """Put first in the bases of any ``Trainer`` subclass: ``class T(AtomicCheckpointMixin,
    SFTTrainer)``. See the module documentation for what it changes.

    Keyword options, taken before the rest go to the ``Trainer``: ``verify_on_resume``
    (``resume_from_checkpoint=True`` takes the newest checkpoint whose files match its
    manifest) and ``durable`` (False: no fsync; atomic against a killed process, not
    against a power loss).

    A verified resume reads each byte once. In one process, ``verify_on_resume=True`` with
    ``train(resume_from_checkpoint=True)`` hashes every file of the checkpoint through a
    memory mapping (``CheckpointDir.resume_verified``) and holds those mappings while
    ``Trainer`` loads the files by their paths (the weights and ``config.json``,
    ``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``, ``rng_state.pth``,
    ``trainer_state.json``, which it reads twice): its reads are served from the very pages
    hashed, so each byte comes from storage once, by the verification. The bound holds while
    the checkpoint fits in the page cache beside the training process: nothing pins the
    pages, and one the kernel evicts in between is read again. The mappings of each group
    are released as soon as the load that reads it returns (``_load_from_checkpoint``,
    ``_load_optimizer_and_scheduler``, ``_load_rng_state``: the first step), the rest when
    ``train`` returns. Not covered: a path passed as ``resume_from_checkpoint`` (it is not
    verified) and :func:`last_checkpoint` (it returns a path: the files are read again by
    Trainer, from storage unless still cached). With several ranks
    (``atomic_ckpt.distributed.resume_verified``), each rank hashes and holds the files it
    loads (the shared ones and its own ``rng_state_<r>.pth``), and rank 0 also the rest;
    rank 0 chooses for every rank.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # inspect.signature(cls) (IDEs, docs, tools) would show our (*args, ..., **kwargs):
        # give the class the real one, the Trainer's parameters with ours.
        cls.__signature__ = _signature_of(cls)  # type: ignore[attr-defined]

    def __init__(
        self, *args: Any, verify_on_resume: bool = False, durable: bool = True, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._atomic_verify = verify_on_resume
        self._atomic_durable = durable
        self._atomic_limit: int | None = None
        self._atomic_in_train = False
        self._atomic_views: dict[str, memoryview] = {}
        world = self.args.world_size
        per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if self.args.save_on_each_node and per_node < world:
            raise ValueError(
                f"AtomicCheckpointMixin does not support save_on_each_node=True on several "
                f"nodes ({world} processes, {per_node} per node): each node would write its "
                "own copy, and rank 0 cannot commit files on another node's disk. Save to a "
                "filesystem every rank shares, with save_on_each_node=False"
            )

    def checkpoint_dir(self, trial: Any = None) -> CheckpointDir:
        """The :class:`~atomic_ckpt.CheckpointDir` of this run's ``checkpoint-N`` directories."""
        return _checkpoints(self._get_output_dir(trial), durable=self._atomic_durable)

    def train(
        self,
        resume_from_checkpoint: str | bool | None = None,
        trial: Any = None,
        ignore_keys_for_eval: list[str] | None = None,
    ) -> TrainOutput:
        """``Trainer.train``; ``resume_from_checkpoint=True`` means the newest complete
        checkpoint of ``output_dir`` (ValueError if there is none), chosen as
        :func:`last_checkpoint` with ``clean=True`` does."""
        if isinstance(resume_from_checkpoint, bool) and resume_from_checkpoint:
            if self.args.output_dir is None:
                raise ValueError("resume_from_checkpoint=True needs args.output_dir")
            found = self._resume_point(self.args.output_dir)
            if found is None:
                # Trainer's own words first: code that matches them keeps working.
                raise ValueError(
                    f"No valid checkpoint found in output directory ({self.args.output_dir}): "
                    "atomic_ckpt found no complete checkpoint-N there (a save killed before "
                    "its commit leaves none)"
                )
            log.info("resuming from %s, the newest complete checkpoint", found)
            resume_from_checkpoint = found
        # Trainer's rotation runs inside the staging dir, where it finds one checkpoint
        # and deletes nothing; ours runs after each commit. But with save_total_limit=1,
        # train() ends by deleting every checkpoint but the best with rmtree, by name:
        # that is switched off while it trains, and done durably after.
        self._atomic_limit = self.args.save_total_limit
        self._atomic_in_train = True
        if self._atomic_limit == 1:
            self.args.save_total_limit = None
        try:
            output = super().train(resume_from_checkpoint, trial, ignore_keys_for_eval)
        finally:
            self._atomic_views = {}  # whatever no load released (no RNG file, say)
            self.args.save_total_limit = self._atomic_limit
            self._atomic_in_train = False
        self._keep_only_best(trial)
        return output

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """``Trainer._save_checkpoint`` inside one (multi-rank) commit of ``checkpoint-N``."""
        run_dir = self._get_output_dir(trial)
        ckpts = _checkpoints(run_dir, durable=self._atomic_durable)
        step = self.state.global_step
        metadata = {
            "global_step": step,
            "epoch": self.state.epoch,
            # A model-only checkpoint has no optimizer or RNG state: not resumable.
            "resumable": not self.args.save_only_model,
        }
        folder = f"{CHECKPOINT_PREFIX}{step}"
        with _commit(ckpts, step, metadata) as staging:
            # Trainer writes "<run dir>/checkpoint-N/...". The run dir becomes the staging
            # dir, where "checkpoint-N" is a link to the staging dir itself: every rank's
            # files land at their final paths, and nothing moves afterwards. Each rank
            # makes the link (or finds it) before it writes anything.
            inner = staging / folder
            with contextlib.suppress(FileExistsError):
                _fs.symlink(".", inner)
            if not inner.is_symlink():
                raise FileExistsError(f"{inner} is not the link this save made")
            failed: BaseException | None = None
            pushes: list[str] = []
            setattr(self, "_get_output_dir", lambda trial=None: str(staging))  # noqa: B010
            # Trainer pushes from inside the save, while the files are in the staging
            # dir (which the commit then renames): the push waits for the commit.
            setattr(self, "_push_from_checkpoint", pushes.append)  # noqa: B010
            try:
                super()._save_checkpoint(model, trial)
            except BaseException as exc:
                failed = exc
            finally:
                delattr(self, "_get_output_dir")
                delattr(self, "_push_from_checkpoint")
            # Every rank has written (or failed: it still comes here, so no rank waits
            # for it in vain; the commit then fails on every rank).
            _barrier()
            if failed is not None:
                raise failed
            self._fix_best_path(run_dir, staging)
            if _rank() == 0:
                os.unlink(inner)
                if (staging / TRAINER_STATE_NAME).exists():
                    self.state.save_to_json(str(staging / TRAINER_STATE_NAME))
        if pushes:  # what was committed, now that it is (then rotation, as Trainer does)
            self._push_from_checkpoint(str(ckpts.path_of(step)))
        if _rank() == 0:
            self._rotate(ckpts)

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """``Trainer._push_from_checkpoint``, leaving :data:`HUB_IGNORE_PATTERNS` out."""
        with _hub_uploads():
            super()._push_from_checkpoint(checkpoint_folder)

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        private: bool | None = None,
        **kwargs: Any,
    ) -> Any:
        """``Trainer.push_to_hub``, leaving :data:`HUB_IGNORE_PATTERNS` out of the upload."""
        with _hub_uploads():
            return super().push_to_hub(commit_message, blocking, token, revision, private, **kwargs)

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        """``Trainer._load_from_checkpoint``; then the mappings of what it read are released."""
        try:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        finally:
            self._release("model")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """``Trainer._load_optimizer_and_scheduler``; then their files' mappings are released."""
        try:
            super()._load_optimizer_and_scheduler(checkpoint)
        finally:
            self._release("optimizer")

    def _load_rng_state(self, checkpoint: str | None) -> None:
        """``Trainer._load_rng_state`` (the last of a resume's loads); then every mapping
        still held is released."""
        try:
            super()._load_rng_state(checkpoint)
        finally:
            self._release("optimizer", "model", "late")

    # ------------------------------------------------------------------ internals

    def _resume_point(self, output_dir: str) -> str | None:
        """The checkpoint ``resume_from_checkpoint=True`` means (as :func:`last_checkpoint`
        with ``clean=True``). Verified, the mappings this process's files were hashed
        through are kept in ``_atomic_views`` for Trainer's loads (see the class); with
        several ranks, each hashes the files it loads and rank 0 chooses (collective)."""
        if not self._atomic_verify:
            return last_checkpoint(output_dir, clean=True)
        ckpts = _checkpoints(output_dir)
        if _rank() == 0:
            _clean(ckpts)
        # Which files to keep mapped: those of the newest checkpoint this rank loads (the
        # one verified, unless it fails and an older one, saved by the same Trainer, is
        # taken); every rank lists the root for that, but rank 0 alone chooses.
        newest = ckpts.latest()
        names = [] if newest is None else _loaded_by(newest, _rank(), _distributed())
        found = resume_verified(ckpts, names)  # one process: ckpts.resume_verified(names)
        if found is None:
            return None
        self._atomic_views = dict(found.files)
        return str(found.checkpoint.path)

    def _release(self, *groups: str) -> None:
        """Drop the mappings of the files read by the loads named in ``groups`` (unmapped
        when the last reference goes: the views are this object's only ones)."""
        for name in [n for n in self._atomic_views if _read_with(n) in groups]:
            del self._atomic_views[name]

    def _fix_best_path(self, run_dir: str, staging: Path) -> None:
        """Trainer looked for the best checkpoint in the staging dir: point it at the root."""
        best = self.state.best_model_checkpoint
        # TrainerState.best_global_step is new in 4.50; before it, best_model_checkpoint
        # is set outside _save_checkpoint, from the run directory itself.
        best_step = getattr(self.state, "best_global_step", None)
        if best is not None and Path(best).parent == staging:
            self.state.best_model_checkpoint = os.path.join(run_dir, Path(best).name)
        elif best is None and best_step:
            older = os.path.join(run_dir, f"{CHECKPOINT_PREFIX}{best_step}")
            if os.path.isdir(older):
                self.state.best_model_checkpoint = older

    def _best_step(self, ckpts: CheckpointDir) -> int | None:
        """The step of the best checkpoint, if it is complete in ``ckpts``."""
        best = self.state.best_model_checkpoint
        if best is None:
            return None
        step = parse_step(Path(best).name, CHECKPOINT_PREFIX)
        if step is None or Path(best).resolve().parent != ckpts.root:
            return None
        try:
            ckpts.get(step)
        except CheckpointNotFoundError:
            return None
        return step

    def _rotate(self, ckpts: CheckpointDir) -> None:
        """``save_total_limit`` and the best checkpoint, as Trainer counts them, through
        the library's retention (rank 0, after the commit is durable)."""
        best = self._best_step(ckpts)
        if best is not None:
            ckpts.set_best(best)
        limit = self._atomic_limit if self._atomic_in_train else self.args.save_total_limit
        if limit is None or limit <= 0:
            return
        steps = ckpts.steps()
        keep_last = limit
        if best is not None and best not in steps[-limit:]:
            keep_last = max(1, limit - 1)  # the best counts toward the limit, as in Trainer
        ckpts.retain(keep_last=keep_last)

    def _keep_only_best(self, trial: Any) -> None:
        """Trainer's end of training with ``save_total_limit=1``: only the best one stays."""
        if self._atomic_limit != 1 or _rank() != 0 or not self.args.should_save:
            return
        ckpts = self.checkpoint_dir(trial)
        best = self._best_step(ckpts)
        if best is None:
            return
        for step in ckpts.steps():
            if step != best:
                log.info("deleting %s due to save_total_limit=1", ckpts.path_of(step))
                ckpts.delete(step)


def _signature_of(cls: type[Any]) -> inspect.Signature | None:
    """What ``cls(...)`` takes when its ``__init__`` is the mixin's: the parameters of the
    ``__init__`` the mixin passes them to, with the mixin's keyword options before any
    ``**kwargs``. None (inspect's own answer) when a subclass has an ``__init__`` of its own."""
    mro = cls.__mro__
    first = next((c for c in mro if "__init__" in c.__dict__), None)
    if first is not AtomicCheckpointMixin:
        return None
    after = next(c for c in mro[mro.index(first) + 1 :] if "__init__" in c.__dict__)
    try:
        base = inspect.signature(after.__dict__["__init__"])
    except (TypeError, ValueError):  # a builtin __init__ without one
        return None
    params = list(base.parameters.values())[1:]  # without self
    own = inspect.signature(AtomicCheckpointMixin.__init__).parameters
    ours = [p for p in own.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    at = next(
        (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params)
    )
    return base.replace(parameters=[*params[:at], *ours, *params[at:]])


class AtomicTrainer(AtomicCheckpointMixin, Trainer):
    """``transformers.Trainer`` whose checkpoints are committed atomically and durably."""
