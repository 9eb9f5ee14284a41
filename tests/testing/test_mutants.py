"""Protocol mutants: switch one step of the commit protocol off, and the simulation finds it.

Each mutant is a :class:`atomic_ckpt.SyncPolicy` with one step disabled
(:func:`atomic_ckpt.testing.mutant`), or a replace that deletes the old step
before renaming the new one (``replace="delete"``). For
each, a small fixed workload where that step matters, and for each crash model
that can see it, the test asserts that :func:`atomic_ckpt.testing.explore`
rejects a crash state and names the invariant that broke. The full protocol
passes every one of these workloads under every model (the control).

Which model sees what: the ``ext4`` model commits every earlier metadata
operation at any fsync (as ext4's journal does), so a missing fsync of a
directory is invisible to it; ``strict`` loses everything unsynced at once,
so it cannot see an ordering bug between two operations that one fsync makes
durable together (delete-then-rename); ``subset`` sees both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import pytest

from atomic_ckpt import MARKER, CheckpointDir
from atomic_ckpt.testing import MODELS, STEPS, explore, mutant

Replace = Literal["exchange", "aside"]

Action = Callable[[CheckpointDir], object]


def _write(path: Path, tag: bytes) -> None:
    """A checkpoint with a file at the top and one two directories down."""
    (path / "model.bin").write_bytes(tag * 40)
    (path / "shards" / "rank0").mkdir(parents=True)
    (path / "shards" / "rank0" / "part.bin").write_bytes(tag * 25)


def _one_earlier_checkpoint(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        _write(path, b"A")


def _new_step_then_replace(ckpts: CheckpointDir) -> None:
    with ckpts.commit(2) as path:
        _write(path, b"B")
    with ckpts.commit(1) as path:
        _write(path, b"C")


def _legacy_marked(ckpts: CheckpointDir) -> None:
    """Older training code's checkpoint: complete, with an empty (touched) marker."""
    path = ckpts.path_of(7)
    path.mkdir(parents=True)
    _write(path, b"L")
    (path / MARKER).write_bytes(b"")


def _remark_legacy(ckpts: CheckpointDir) -> None:
    ckpts.mark_complete(7)


def _root_only(ckpts: CheckpointDir) -> None:
    ckpts.root.mkdir(parents=True)


def _write_then_adopt(ckpts: CheckpointDir) -> None:
    """A directory written just now without the library, then adopted."""
    path = ckpts.path_of(8)
    path.mkdir()
    _write(path, b"N")
    ckpts.mark_complete(8)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    setup: Action | None
    save: Action


COMMITS = Workload(
    "commit a new step, then replace one", _one_earlier_checkpoint, _new_step_then_replace
)
FIRST_COMMITS = Workload("first commits into a new root", None, _new_step_then_replace)
REMARK = Workload("mark_complete over a legacy empty marker", _legacy_marked, _remark_legacy)
ADOPT = Workload("write a directory, then mark_complete it", _root_only, _write_then_adopt)
WORKLOADS = (COMMITS, FIRST_COMMITS, REMARK, ADOPT)

# mutant -> (what is switched off: a SyncPolicy step or replace="delete", workload,
#            {model: invariant the simulation reports})
MUTANTS: dict[str, tuple[str, Workload, dict[str, str]]] = {
    # A file's data not fsynced: a complete checkpoint with an empty or zeroed file.
    "fsync_files": ("file", COMMITS, {"strict": "I1", "ext4": "I1", "subset": "I1"}),
    # Subdirectories not fsynced: a complete checkpoint whose shards/ lost its entries.
    "fsync_dirs": ("subdir", COMMITS, {"strict": "I1", "subset": "I1"}),
    # The marker's data not fsynced: an empty or zero-filled marker in a complete step.
    "fsync_marker": ("marker", COMMITS, {"strict": "I1", "ext4": "I1", "subset": "I1"}),
    # The manifest written in place over a legacy marker: a torn rewrite makes a
    # complete checkpoint unreadable while it is being re-marked.
    "marker_via_tmp": ("marker_tmp", REMARK, {"ext4": "I3"}),
    # ... and over a directory adopted just now: an empty marker no one wrote.
    "marker_via_tmp/adopt": ("marker_tmp", ADOPT, {"ext4": "I1", "subset": "I1"}),
    # The checkpoint dir not fsynced: the renamed dir has lost its marker or files.
    "fsync_staging": ("staging", COMMITS, {"strict": "I2", "subset": "I1"}),
    # ... in mark_complete, where no rename follows: the marker lands before the files.
    "fsync_staging/adopt": ("staging", ADOPT, {"strict": "I2", "subset": "I1"}),
    # The root not fsynced: the rename that commits is lost after commit returned.
    "fsync_root": ("root", COMMITS, {"strict": "I2", "ext4": "I2", "subset": "I2"}),
    # ... and in a new root, whose own entry in its parent is never made durable.
    "fsync_root/first": ("root", FIRST_COMMITS, {"strict": "I2", "ext4": "I2", "subset": "I2"}),
    # ... and in mark_complete of a directory just written.
    "fsync_root/adopt": ("root", ADOPT, {"strict": "I2", "subset": "I2"}),
    # Delete the old step, then rename the new one: a window with neither.
    "replace=delete": ("replace=delete", COMMITS, {"ext4": "I3", "subset": "I3"}),
}


CASES = [
    pytest.param(name, model, invariant, id=f"{name}-{model}")
    for name, (_, _, found) in MUTANTS.items()
    for model, invariant in found.items()
]


@pytest.mark.parametrize(("name", "model", "invariant"), CASES)
@pytest.mark.parametrize("prefix", ["", "checkpoint-"], ids=["plain", "prefixed"])
def test_simulation_catches_the_mutant(name: str, model: str, invariant: str, prefix: str) -> None:
    """With one protocol step switched off, some crash state breaks the named invariant
    (in a plain root and in a prefixed one)."""
    off, workload, _ = MUTANTS[name]
    report = explore(
        workload.save,
        setup=workload.setup,
        prefix=prefix,
        sync=None if off == "replace=delete" else mutant(off),
        replace="delete" if off == "replace=delete" else "exchange",
        models=(model,),
    )
    assert report.failure is not None, f"{name} survived the {model} model: {report}"
    assert report.failure.invariant == invariant, str(report.failure)


def test_every_protocol_step_has_a_mutant() -> None:
    """Every step of SyncPolicy (each fsync, the marker temp name) and the replace is mutated."""
    switched = {off for off, _, _ in MUTANTS.values()}
    assert switched == {*STEPS, "replace=delete"}
    assert all(found for _, _, found in MUTANTS.values())


@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
@pytest.mark.parametrize("replace", ["exchange", "aside"])
@pytest.mark.parametrize("prefix", ["", "checkpoint-"], ids=["plain", "prefixed"])
def test_full_protocol_passes_the_mutant_workloads(
    workload: Workload, replace: Replace, prefix: str
) -> None:
    """The control: the full protocol (with exchange or the move-aside fallback) passes, in
    a plain root (staging ``N.tmp-<hex>``) and a prefixed one (``.tmp-<prefix>N.<hex>``)."""
    report = explore(
        workload.save,
        setup=workload.setup,
        replace=replace,
        prefix=prefix,
        models=MODELS,
    )
    assert report.ok, str(report)


@pytest.mark.parametrize("workload", [COMMITS, FIRST_COMMITS], ids=lambda w: w.name)
def test_marker_temp_name_cannot_matter_when_a_rename_commits(workload: Workload) -> None:
    """Writing the marker in place is safe inside a staging dir: nothing there is visible
    until the rename, and everything is fsynced before it (PROTOCOL.md, fine print)."""
    report = explore(
        workload.save,
        setup=workload.setup,
        sync=mutant("marker_tmp"),
        models=MODELS,
    )
    assert report.ok, str(report)
