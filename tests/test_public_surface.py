"""The public surface: every name users import today stays importable from the same place.

The list below is the surface of 0.2 (taken from ``main`` before the layout moved into
layer packages). A refactor that moves or drops one of these names fails here; adding a
name is fine, removing one is a breaking change for users and needs a deprecation first.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

PUBLIC: dict[str, tuple[str, ...]] = {
    "atomic_ckpt": (
        "AsyncCommitter",
        "BEST_LINK",
        "Checkpoint",
        "CheckpointDir",
        "CheckpointError",
        "CheckpointNotFoundError",
        "CheckpointTimeoutError",
        "Commit",
        "CommitStateError",
        "CommitterClosedError",
        "DiskFullError",
        "DistributedCommitError",
        "DistributedNotInitializedError",
        "Entry",
        "FileEntry",
        "InsideCheckpointError",  # added for the final save into a checkpoint (issue 35)
        "InvalidRootError",
        "InvalidStepError",
        "MARKER",
        "Manifest",
        "ManifestError",
        "NamedCheckpoint",
        "NoSync",
        "NotDurableError",
        "ResumePlan",
        "RetentionPolicy",
        "RootNotWritableError",
        "StagingLostError",
        "StepConflictError",
        "SymlinksUnsupportedError",
        "SyncPolicy",
        "TMP_INFIX",
        "UnmarkedCheckpointsError",
        "UnusableCheckpointsError",
        "VerificationError",
        "__version__",
        "atomic_write",
        "clean_temporaries",
        "commit",
        "commit_directory",
        "latest",
        "parse_step",
        "remove_directory",
        "remove_file",
        "replace_symlink",
        "temp_name",
        "write_bytes_atomic",
    ),
    "atomic_ckpt.torch": (
        "FROZEN_FILE",  # added with save_state(carry_frozen=True) (issue 32)
        "MODEL_FILE",
        "OPTIMIZER_FILE",
        "SCHEDULER_FILE",
        "STATE_FILE",
        "TrainingState",
        "load_state",
        "resume",
        "save_state",
        "write_state",
    ),
    "atomic_ckpt.distributed": (
        "DEFAULT_ENTRY_TIMEOUT",
        "DEFAULT_TIMEOUT",
        "declare",
        "distributed_commit",
        "load_dcp",
        "rank_path",
        "resume",
    ),
    "atomic_ckpt.dcp": (
        "AtomicWriter",
        "PendingSaveError",
        "TESTED_TORCH",
        "async_save",
        "save",
    ),
    "atomic_ckpt.remote": (
        "ATTEMPT_KEY",
        "AsyncRemoteCommitter",
        "DEFAULT_GRACE",
        "Mirror",
        "NoSuchBucketError",
        "RemoteCheckpoint",
        "RemoteCheckpointDir",
        "RemoteCommit",
        "RemoteEntry",
        "UnsupportedStoreError",
        "open",
    ),
    "atomic_ckpt.testing": (
        "Checker",
        "CrashState",
        "Expectation",
        "Failure",
        "InvariantViolation",
        "MODELS",
        "Op",
        "Recording",
        "Replace",
        "Report",
        "STEPS",
        "Tree",
        "Version",
        "check_invariants",
        "explore",
        "mutant",
        "read_tree",
        "record",
    ),
    "atomic_ckpt.testing.dcp": (
        "dcp_saver",
        "loads_exactly",
    ),
    "atomic_ckpt.testing.invariants": ("check_invariants",),
    "atomic_ckpt.testing.mutants": (
        "API_MUTANTS",
        "STEPS",
        "api_mutant",
        "mutant",
    ),
    "atomic_ckpt.testing.model": (
        "Observation",
        "Refused",
        "RootModel",
        "Saved",
        "Target",
        "observe",
    ),
    "atomic_ckpt.testing.actions": ("A", "Action", "B", "Boom", "LEGACY", "PART"),
    "atomic_ckpt.testing.alphabet": ("ACTIONS", "ALPHABET", "EXCLUDED", "ROOTS", "Root", "by_name"),
    "atomic_ckpt.testing.histories": (
        "CONCURRENT",
        "Call",
        "check_history",
        "random_plans",
        "run_history",
    ),
    "atomic_ckpt.testing.sequences": (
        "Outcome",
        "Totals",
        "check_sequence",
        "explore_sequences",
        "sequences",
    ),
    "atomic_ckpt.integrations.transformers": (
        "AtomicCheckpointMixin",
        "AtomicTrainer",
        "CHECKPOINT_PREFIX",
        "PRIVATE_METHODS",
        "TESTED_RANGE",
        "check_transformers",
        "last_checkpoint",
    ),
    "atomic_ckpt.integrations": ("TestedRange", "UntestedVersionWarning"),
    "atomic_ckpt.integrations.accelerate": (
        "ITERATION_KEY",
        "TESTED_RANGE",
        "load_state",
        "save_state",
    ),
    "atomic_ckpt.integrations.lightning": (
        "AtomicCheckpointIO",
        "AtomicFSDPStrategy",
        "AtomicModelCheckpoint",
        "AtomicModelParallelStrategy",
        "LightningClasses",
        "TESTED_RANGE",
        "TESTED_VERSIONS",
        "classes_for",
    ),
    "atomic_ckpt.cli": ("main",),
}

NEEDS = {
    "atomic_ckpt.torch": "torch",
    "atomic_ckpt.distributed": "torch",
    "atomic_ckpt.dcp": "torch",
    "atomic_ckpt.testing.dcp": "torch",
    "atomic_ckpt.remote": "fsspec",
    "atomic_ckpt.integrations.transformers": "transformers",
    "atomic_ckpt.integrations.accelerate": "accelerate",
    "atomic_ckpt.integrations.lightning": "lightning",
}


def _module(path: str) -> object:
    if path in NEEDS:
        pytest.importorskip(NEEDS[path])
    return importlib.import_module(path)


@pytest.mark.parametrize(("path", "name"), [(p, n) for p, ns in PUBLIC.items() for n in ns])
def test_every_public_name_is_importable_from_its_public_path(path: str, name: str) -> None:
    """``from <path> import <name>`` works for every name of the 0.2 surface."""
    module = _module(path)
    assert hasattr(module, name), f"{path}.{name} disappeared"


@pytest.mark.parametrize("path", [p for p in PUBLIC if p != "atomic_ckpt.cli"])
def test_every_public_module_lists_its_names_in_all(path: str) -> None:
    """``__all__`` names the 0.2 surface (so ``from path import *`` and the docs see it)."""
    module = _module(path)
    missing = set(PUBLIC[path]) - set(getattr(module, "__all__", ()))
    assert not missing, f"{path}.__all__ lacks {sorted(missing)}"


@pytest.mark.parametrize(("path", "name"), [(p, n) for p, ns in PUBLIC.items() for n in ns])
def test_public_classes_and_functions_report_a_public_module(path: str, name: str) -> None:
    """A public class or function says it lives at a public path (no private ``._x``
    segment), which is what tracebacks, reprs, pickles and the API docs show."""
    obj = getattr(_module(path), name)
    if not (inspect.isclass(obj) or inspect.isfunction(obj)):
        return
    parts = obj.__module__.split(".")
    assert parts[0] == "atomic_ckpt"
    assert not any(p.startswith("_") for p in parts[1:]), f"{path}.{name}: {obj.__module__}"
    assert getattr(importlib.import_module(obj.__module__), obj.__name__) is obj
