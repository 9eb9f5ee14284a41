"""The Trainer mixin: save inside one commit, rotation by retention, verified resume, hub push."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import Trainer
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import TrainOutput

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError, parse_step
from atomic_ckpt.integrations.transformers._classdef import check_bases, signature_of
from atomic_ckpt.integrations.transformers._compat import save_model_is_collective
from atomic_ckpt.integrations.transformers._final import (
    _clean_if_present,
    _final_save,
    _means_latest,
    _refuse_run_inside_checkpoint,
    _save_metrics,
)
from atomic_ckpt.integrations.transformers._hub import _hub_uploads, _Uploading
from atomic_ckpt.integrations.transformers._resume import (
    CHECKPOINT_PREFIX,
    _barrier,
    _checkpoints,
    _clean,
    _rank,
    _read_with,
)
from atomic_ckpt.integrations.transformers._save import (
    _commit,
    lift_inner,
    make_inner,
)
from atomic_ckpt.integrations.transformers._verified import (
    _VerifiedPath,
    last_checkpoint,
    verified_latest,
    verified_path,
)

log = logging.getLogger(__package__ or __name__)


if TYPE_CHECKING:
    _Base = Trainer
else:
    _Base = object


class AtomicCheckpointMixin(_Base):
    """Put first in the bases of any ``Trainer`` subclass: ``class T(AtomicCheckpointMixin,
    SFTTrainer)``. See the module documentation for what it changes.

    Keyword options, taken before the rest go to the ``Trainer``: ``verify_on_resume``
    (``resume_from_checkpoint=True`` takes the newest checkpoint whose files match its
    manifest), ``durable`` (False: no fsync; atomic against a killed process, not
    against a power loss) and ``dedup`` (True: at each checkpoint's commit, every file
    whose size and checksum equal the same file of the previous checkpoint, such as the
    ``save_pretrained`` shards of frozen weights, the tokenizer and the config, becomes a
    hard link or reflink to it instead of a second copy on disk; ``replace_unusable``
    (True: a save may replace a checkpoint moved there by hand or written by a newer
    release, as for ``CheckpointDir.commit``; without it the save refuses); see
    ``docs/guides/incremental.md``).

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
    ``train`` returns. The same holds for a path taken from
    ``last_checkpoint(verify=True)`` (verified there; its string carries the mappings,
    which ``train`` takes over, verifying nothing again) and, with
    ``verify_on_resume=True``, for a ``checkpoint-N`` path passed as
    ``resume_from_checkpoint``: it is verified first (a VerificationError if it does not
    verify: a path the caller chose is never swapped for an older one). With several ranks
    (``atomic_ckpt.distributed.resume_verified``), each rank hashes and holds the files it
    loads (the shared ones and its own ``rng_state_<r>.pth``), and rank 0 also the rest;
    rank 0 chooses for every rank.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_bases(cls, AtomicCheckpointMixin, Trainer)
        # inspect.signature(cls) (IDEs, docs, tools) would show our (*args, ..., **kwargs):
        # give the class the real one, the Trainer's parameters with ours.
        cls.__signature__ = signature_of(cls, AtomicCheckpointMixin)  # type: ignore[attr-defined]

    def __init__(
        self,
        *args: Any,
        verify_on_resume: bool = False,
        durable: bool = True,
        dedup: bool = False,
        replace_unusable: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._atomic_replace = bool(replace_unusable)
        self._atomic_verify = verify_on_resume
        self._atomic_durable = durable
        self._atomic_dedup = bool(dedup)
        self._atomic_limit: int | None = None
        self._atomic_in_train = False
        self._atomic_views: dict[str, memoryview] = {}
        self._atomic_saving = False  # inside _save_checkpoint: save_model writes a commit
        self._atomic_uploading = _Uploading()  # Hub uploads still reading a checkpoint
        self._atomic_deferred = False  # a rotation kept one for an upload: rotate again
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
        :func:`last_checkpoint` with ``clean=True`` does.

        So do the strings ``"true"`` and ``"latest"`` (any case), which is what an example
        script's ``--resume_from_checkpoint True`` passes (its argument is a string), unless
        a directory of that name exists: then it is the path it names. Every start, a
        resume from a path and a fresh run included, first removes what killed saves left
        in ``output_dir`` (never a live save), logging each removal; before anything, an
        ``output_dir`` that is or is inside a committed checkpoint is refused (every rank).
        """
        if self.args.output_dir is not None:
            _refuse_run_inside_checkpoint(self.args.output_dir)
        if _means_latest(resume_from_checkpoint):
            resume_from_checkpoint = True
        elif self.args.output_dir is not None and _rank() == 0:
            _clean_if_present(self.args.output_dir)
        if isinstance(resume_from_checkpoint, _VerifiedPath):  # last_checkpoint(verify=True)
            self._atomic_views = resume_from_checkpoint.take()
        elif self._atomic_verify and isinstance(resume_from_checkpoint, str | os.PathLike):
            found_path = verified_path(resume_from_checkpoint)  # read once, as below
            self._atomic_views = found_path.take()
            resume_from_checkpoint = str(found_path)
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
        if self._atomic_deferred and _rank() == 0:  # Trainer waited for its uploads
            self._rotate(self.checkpoint_dir(trial))
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
        with _commit(
            ckpts, step, metadata, dedup=self._atomic_dedup, replace_unusable=self._atomic_replace
        ) as staging:
            # Trainer writes "<run dir>/checkpoint-N/...". The run dir becomes the staging
            # dir, where "checkpoint-N" is a link to the staging dir itself: every rank's
            # files land at their final paths (without symlinks: a directory, moved up).
            make_inner(staging, folder)
            failed: BaseException | None = None
            pushes: list[str] = []
            setattr(self, "_get_output_dir", lambda trial=None: str(staging))  # noqa: B010
            # Trainer pushes from inside the save, while the files are in the staging
            # dir (which the commit then renames): the push waits for the commit.
            setattr(self, "_push_from_checkpoint", pushes.append)  # noqa: B010
            self._atomic_saving = True
            try:
                super()._save_checkpoint(model, trial)
            except BaseException as exc:
                failed = exc
            finally:
                self._atomic_saving = False
                delattr(self, "_get_output_dir")
                delattr(self, "_push_from_checkpoint")
            # Every rank has written (or failed: it still comes here, so no rank waits
            # for it in vain; the commit then fails on every rank).
            _barrier()
            if failed is not None:
                raise failed
            self._fix_best_path(run_dir, staging)
            if _rank() == 0:
                lift_inner(staging, folder)
                if (staging / TRAINER_STATE_NAME).exists():
                    # A new file, never a write through the old one (which a link may share).
                    os.unlink(staging / TRAINER_STATE_NAME)
                    self.state.save_to_json(str(staging / TRAINER_STATE_NAME))
        if pushes:  # what was committed, now that it is (then rotation, as Trainer does)
            self._push_from_checkpoint(str(ckpts.path_of(step)))
        if _rank() == 0:
            self._rotate(ckpts)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """``Trainer.save_model``, each file whole and durable when it returns.

        Inside a checkpoint save the files go into that commit. Called on its own (the
        final save of a script, ``push_to_hub``'s local save) the model is saved into a
        staging directory beside (``.tmp-final-model.<hex>``, locked while it is written,
        so ``clean()`` removes it only after a killed save), then each file is fsynced and
        renamed over its place in ``output_dir``, and the directory is fsynced: every
        file is either the old one or the new one, whole, at its usual path. (Atomic per
        file, not for the set: a crash between two renames leaves some files new.)

        Collective exactly where stock ``save_model`` is (:func:`save_model_is_collective`:
        DeepSpeed, FSDP full state, a model sharded at load time...); under plain DDP rank 0
        saves alone and the other ranks return, so a script may call it on rank 0 only.
        """
        if self._atomic_saving:
            super().save_model(output_dir, _internal_call)
            return
        target = output_dir if output_dir is not None else self.args.output_dir
        if target is None:
            raise ValueError("save_model needs an output_dir (or args.output_dir)")
        collective = save_model_is_collective(self)
        if collective or _rank() == 0:
            with _final_save(
                target, durable=self._atomic_durable, collective=collective, weights=True
            ) as at:
                super().save_model(at, _internal_call=True)
        else:  # stock's non-writing rank: it returns without writing or waiting
            super().save_model(target, _internal_call=True)
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def save_state(self) -> None:
        """``Trainer.save_state``: ``trainer_state.json`` replaced atomically and durably."""
        if not self.is_world_process_zero():
            return
        if self.args.output_dir is None:
            raise ValueError("save_state needs args.output_dir")
        with _final_save(
            self.args.output_dir, durable=self._atomic_durable, collective=False
        ) as staging:
            self.state.save_to_json(os.path.join(staging, TRAINER_STATE_NAME))

    def save_metrics(self, split: str, metrics: dict[str, Any], combined: bool = True) -> None:
        """``Trainer.save_metrics``: ``<split>_results.json`` and ``all_results.json`` each
        replaced atomically and durably."""
        if not self.is_world_process_zero():
            return
        if self.args.output_dir is None:
            raise ValueError("save_metrics needs args.output_dir")
        _save_metrics(
            self.args.output_dir, split, metrics, combined=combined, durable=self._atomic_durable
        )

    def _push_from_checkpoint(self, checkpoint_folder: str) -> None:
        """``Trainer._push_from_checkpoint``, leaving :data:`HUB_IGNORE_PATTERNS` out."""
        with _hub_uploads(self._atomic_uploading):
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
        # By keyword, and ``private`` only when given: transformers 4.x has no ``private``
        # parameter (its **kwargs go to create_model_card, which refuses it).
        if private is not None:
            kwargs["private"] = private
        with _hub_uploads():
            return super().push_to_hub(
                commit_message=commit_message,
                blocking=blocking,
                token=token,
                revision=revision,
                **kwargs,
            )

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
        found = verified_latest(ckpts)
        if found is None:
            return None
        self._atomic_views = found.take()
        return str(found)

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
        if best is not None:  # (a file naming it where the filesystem makes no symlinks)
            ckpts.set_best(best)
        limit = self._atomic_limit if self._atomic_in_train else self.args.save_total_limit
        if limit is None or limit <= 0:
            return
        steps = ckpts.steps()
        keep_last = limit
        if best is not None and best not in steps[-limit:]:
            keep_last = max(1, limit - 1)  # the best counts toward the limit, as in Trainer
        uploading = self._atomic_uploading.steps(ckpts)
        self._atomic_deferred = False
        if not uploading:
            ckpts.retain(keep_last=keep_last)
            return
        # retain()'s plan (the best kept by step too), less what a background Hub upload
        # still reads: kept until it ends (the next rotation, or
        # the end of train(), deletes it).
        keep = {*steps[-keep_last:], *([] if best is None else [best])}
        for step in steps:
            if step in keep:
                continue
            if step in uploading:
                log.info("keeping %s while its Hub upload runs", ckpts.path_of(step))
                self._atomic_deferred = True
                continue
            ckpts.delete(step, missing_ok=True)

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


class AtomicTrainer(AtomicCheckpointMixin, Trainer):
    """``transformers.Trainer`` whose checkpoints are committed atomically and durably."""
