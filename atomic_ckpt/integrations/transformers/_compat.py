"""The installed transformers, checked at import: its version and the private Trainer methods."""

from __future__ import annotations

import inspect
from typing import Any

import transformers
import transformers.trainer as _trainer_module
from transformers import Trainer

from atomic_ckpt.integrations._versions import TestedRange, warn_if_untested

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
        "atomic_ckpt.integrations.transformers",
        TESTED_RANGE,
        version,
        [f"Trainer.{name}" for name in PRIVATE_METHODS],
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


def save_model_is_collective(trainer: Any) -> bool:
    """Whether the installed ``Trainer.save_model`` needs every rank (it gathers the state
    on all of them), read the way it decides: XLA, SageMaker model parallelism, DeepSpeed,
    FSDP with ``FULL_STATE_DICT`` (with any other state-dict type stock saves nothing), and
    a model sharded at load time (5.x ``is_distributed_loading_by_transformers``: its
    ``save_pretrained`` gathers on every rank). Anywhere else (plain DDP) stock writes from
    rank 0 and the other ranks return at once, so a script may call it on rank 0 alone:
    the final save must then make no collective either, or it waits forever."""
    stock: Any = _trainer_module  # the very functions Trainer.save_model asks
    if stock.is_torch_xla_available() or stock.is_sagemaker_mp_enabled():
        return True
    if getattr(trainer, "is_fsdp_enabled", False):
        plugin = trainer.accelerator.state.fsdp_plugin
        return "FULL_STATE_DICT" in str(plugin.state_dict_type)
    if getattr(trainer, "is_deepspeed_enabled", False):
        return True
    return bool(getattr(trainer, "is_distributed_loading_by_transformers", False))
