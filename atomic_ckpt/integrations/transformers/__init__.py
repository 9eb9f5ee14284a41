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

try:  # the extra's imports first, for the one-line install hint
    import torch.distributed  # noqa: F401
    import transformers
    import transformers.trainer
    import transformers.trainer_utils  # noqa: F401
except ImportError as _exc:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"atomic_ckpt.integrations.transformers needs transformers ({_exc}): "
        "pip install 'atomic_ckpt[transformers]'"
    ) from _exc

from atomic_ckpt._core.l1_names import public as _public
from atomic_ckpt.integrations.transformers import _compat, _hub, _resume
from atomic_ckpt.integrations.transformers._compat import check_transformers
from atomic_ckpt.integrations.transformers._mixin import AtomicCheckpointMixin, AtomicTrainer
from atomic_ckpt.integrations.transformers._verified import last_checkpoint

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


TESTED_RANGE = _compat.TESTED_RANGE
"""The transformers versions CI runs this module's tests with, the oldest and the newest.

4.47 is the oldest: ``Trainer._save_checkpoint`` took a third parameter (``metrics``)
before it. Outside the range the import warns
(:class:`~atomic_ckpt.integrations.UntestedVersionWarning`)."""

PRIVATE_METHODS = _compat.PRIVATE_METHODS
"""Every private ``Trainer`` method this module overrides or redirects, with its parameters.

The one place they are named; :func:`check_transformers` compares them with the installed
``Trainer`` at import. (``train`` is overridden too, but it is public.)"""


HUB_IGNORE_PATTERNS = _hub.HUB_IGNORE_PATTERNS
"""Added to the ``ignore_patterns`` of every upload Trainer makes (beside its own ``_*`` and
``checkpoint-*``): the library's staging, aside and lock entries, which are never part of a
checkpoint (their names, and only theirs, contain ``.tmp-``; a plain Trainer's output
directory holds none). ``*`` matches across ``/``, so nothing inside them goes either."""

CHECKPOINT_PREFIX = _resume.CHECKPOINT_PREFIX
"""``checkpoint-``: the step directories are Hugging Face's ``checkpoint-N``."""

_public.export(__name__, globals(), __all__)
