"""Real SIGKILLs of amend, named promotion and aliases (issue 14).

A child process (``_trainer_kill_child.py``) runs one operation on a prepared
root and kills itself just before or just after the Nth hooked call (every
function of ``atomic_ckpt._core.l2_syscalls.fs``, ``os.replace``, each file write of the body),
for every N the operation makes. Then, on the real filesystem:

* every complete step verifies;
* an amended step is the old version or the new one, files and metadata alike,
  never a mix, and the new one if the amend returned;
* a named checkpoint is still named or promoted, never lost, and a name never
  holds anything but its own save;
* every alias resolves to a complete checkpoint;
* ``clean()`` then leaves nothing behind (in the root or inside a checkpoint),
  and the operation can be carried out again.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from _real_support import leftovers
from _trainer_kill_child import (
    NAMED,
    NEW,
    NEXT,
    OLD,
    OPS,
    STEP2,
    STEP3,
    new_dir,
    prepare,
)

from atomic_ckpt import BEST_LINK, MARKER, TMP_INFIX, CheckpointDir, CheckpointNotFoundError
from atomic_ckpt._core.l1_names.names import is_marker_name

pytestmark = pytest.mark.slow  # the slow tier (docs/contributing.md): python -m pytest -m slow

CHILD = Path(__file__).with_name("_trainer_kill_child.py")
WORKERS = 2


@dataclass
class Run:
    returncode: int
    lines: list[str]
    stderr: str

    @property
    def ok(self) -> set[str]:
        """The phases that returned."""
        return {line.split()[1] for line in self.lines if line.startswith("ok ")}

    @property
    def events(self) -> int:
        return sum(1 for line in self.lines if line.startswith("event "))

    @property
    def returned(self) -> set[int]:
        """The hooked calls that returned (a call that raised, such as the first try of a
        rename_noreplace over an existing step, has no "after")."""
        return {int(line.split()[1]) for line in self.lines if line.startswith("returned ")}


def run_child(root: Path, op: str, *extra: str) -> Run:
    proc = subprocess.run(
        [sys.executable, str(CHILD), str(root), "--op", op, *extra],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Run(proc.returncode, proc.stdout.splitlines(), proc.stderr)


# ---------------------------------------------------------------- the checker


def tree(directory: Path) -> dict[str, bytes]:
    """Every regular file under ``directory`` but the marker."""
    out: dict[str, bytes] = {}
    for top, _dirs, files in os.walk(directory):
        for name in files:
            path = Path(top, name)
            # A stray temporary marker is reported by check_insides after clean().
            if not is_marker_name(name) and not path.is_symlink():
                out[path.relative_to(directory).as_posix()] = path.read_bytes()
    return out


def version(ckpts: CheckpointDir, step: int) -> tuple[dict[str, bytes], str] | None:
    """(files, metadata "version") of the complete, verified step; None if it is not there."""
    try:
        ckpt = ckpts.verify(step)
    except CheckpointNotFoundError:
        return None
    return tree(ckpt.path), ckpt.manifest.metadata.get("version", "")


def named(ckpts: CheckpointDir, name: str) -> tuple[dict[str, bytes], str] | None:
    try:
        ckpt = ckpts.get_named(name)
    except CheckpointNotFoundError:
        return None
    return tree(ckpt.path), ckpt.manifest.metadata.get("version", "")


def check_aliases(ckpts: CheckpointDir) -> dict[str, str]:
    """Every alias names a complete checkpoint (a step that verifies, or a named one)."""
    found: dict[str, str] = {}
    for name in os.listdir(ckpts.root):
        path = ckpts.root / name
        if not path.is_symlink() or name == BEST_LINK or TMP_INFIX in name:
            continue
        target = os.readlink(path)
        found[name] = target
        assert "/" not in target, f"alias {name} -> {target} leaves the root"
        if target.isdigit():
            assert version(ckpts, int(target)) is not None, f"alias {name} -> {target} dangles"
        else:
            assert named(ckpts, target) is not None, f"alias {name} -> {target} dangles"
    return found


def check_insides(ckpts: CheckpointDir) -> None:
    """Nothing but the manifest's entries and the marker inside any checkpoint."""
    for ckpt in [*ckpts.checkpoints(), *ckpts.named()]:
        listed = {e.path.split("/")[0] for e in ckpt.manifest.files} | {MARKER}
        extra = set(os.listdir(ckpt.path)) - listed
        assert not extra, f"{ckpt.path} holds {sorted(extra)} besides its files and marker"


AMENDED = dict(NEW)


def check_amend(ckpts: CheckpointDir, ok: set[str], *, metadata_only: bool) -> None:
    new = (OLD, "new") if metadata_only else (AMENDED, "new")
    got = version(ckpts, 1)
    assert got is not None, "the amended step is missing"
    if "amend" in ok:
        assert got == new, f"the amend returned, but step 1 holds {got[1]!r} {sorted(got[0])}"
    else:
        assert got in ((OLD, "old"), new), f"step 1 is a mix: {got[1]!r} {sorted(got[0])}"
    assert version(ckpts, 2) == (STEP2, "two")
    assert named(ckpts, "interrupted") == (NAMED, "named")
    assert check_aliases(ckpts) == {"e1": "1", "e2": "2", "last": "2"}


def check_promote(ckpts: CheckpointDir, ok: set[str], *, step: int) -> None:
    promoted = (NAMED, "named")
    still = named(ckpts, "interrupted")
    got = version(ckpts, step)
    assert still in (None, promoted), (
        f"the name 'interrupted' holds another save: {still[1]!r} {sorted(still[0])}"
        if still
        else ""
    )
    assert still is not None or got == promoted, "the named checkpoint was lost"
    if "promote" in ok:
        assert still is None, "promote_named returned, but the name is still there"
        assert got == promoted
    if step == 2:
        assert got in ((STEP2, "two"), promoted), "step 2 (replaced) is missing or a mix"
    else:
        assert got in (None, promoted)
        assert version(ckpts, 2) == (STEP2, "two")
    assert version(ckpts, 1) == (OLD, "old")
    check_aliases(ckpts)


def check_alias_life(ckpts: CheckpointDir, ok: set[str]) -> None:
    found = check_aliases(ckpts)
    steps = set(ckpts.steps())
    if "commit" in ok:
        assert version(ckpts, 3) == (STEP3, "three")
        assert found.get("last") == "3"
        assert found.get("e3") == "3"
    if "delete" in ok:  # gone for good: not listed, no directory, no alias naming it
        assert not ckpts.path_of(1).exists(), f"deleted step 1 is still there: {sorted(steps)}"
        assert "1" not in found.values(), f"an alias still names deleted step 1: {found}"
    if "retain" in ok:
        assert not ckpts.path_of(2).exists(), f"retained-away step 2 is there: {sorted(steps)}"
        assert "2" not in found.values(), f"an alias still names deleted step 2: {found}"
    nxt = named(ckpts, "next")
    if "named" in ok:
        assert nxt is not None or version(ckpts, 4) == (NEXT, "next"), "'next' was lost"
    assert nxt in (None, (NEXT, "next"))
    if "promote" in ok:
        assert version(ckpts, 4) == (NEXT, "next")
        assert nxt is None


CHECKS: dict[str, Callable[[CheckpointDir, set[str]], None]] = {
    "amend": lambda c, ok: check_amend(c, ok, metadata_only=False),
    "amend-metadata": lambda c, ok: check_amend(c, ok, metadata_only=True),
    "promote-new": lambda c, ok: check_promote(c, ok, step=3),
    "promote-replace": lambda c, ok: check_promote(c, ok, step=2),
    "aliases": check_alias_life,
}


def carry_on(ckpts: CheckpointDir, op: str) -> None:
    """After clean(), the operation (or the next commit) can still be carried out."""
    if op.startswith("amend"):
        OPS[op](ckpts, None, lambda _: None)
        CHECKS[op](ckpts, {"amend"})
    elif op.startswith("promote") and named(ckpts, "interrupted") is not None:
        OPS[op](ckpts, None, lambda _: None)
        CHECKS[op](ckpts, {"promote"})
    with ckpts.commit(9, aliases=["last"]) as path:
        (path / "model.bin").write_bytes(b"nine")
    assert check_aliases(ckpts)["last"] == "9"


def one_kill(tmp: Path, op: str, point: int, when: str) -> str | None:
    """Kill ``op`` at ``point``; None if every check passed, else what failed."""
    root = tmp / f"{op}-{when}-{point}"
    prepare(root)
    run = run_child(root, op, "--kill-at", str(point), "--kill-when", when)
    hooks = [line for line in run.lines if line.startswith("hook ")]
    where = hooks[0] if hooks else f"{when} event {point}"
    if run.returncode != -9 or not hooks:  # the fault must have fired
        return f"{where}: the child was not killed (rc {run.returncode}): {run.stderr[-500:]}"
    ckpts = new_dir(root)
    try:
        CHECKS[op](ckpts, run.ok)
        ckpts.clean()
        assert leftovers(root) == [], f"clean() left {leftovers(root)}"
        check_insides(ckpts)
        CHECKS[op](ckpts, run.ok)
        carry_on(ckpts, op)
    except AssertionError as exc:
        return f"{where} (returned: {sorted(run.ok)}): {exc}".splitlines()[0]
    return None


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_a_kill_at_any_call_of_the_operation_keeps_every_invariant(
    tmp_path: Path, op: str, when: str
) -> None:
    """SIGKILL before (after) each hooked call, one process per call: every check holds."""
    prepare(tmp_path / "record")
    record = run_child(tmp_path / "record", op, "--record")
    assert record.returncode == 0, record.stderr
    assert record.lines[-1] == "done"
    failures: list[str] = []
    try:  # the run that was not killed is right too
        CHECKS[op](new_dir(tmp_path / "record"), record.ok)
    except AssertionError as exc:
        failures.append(f"not killed: {exc}".splitlines()[0])
    points = [n for n in range(1, record.events + 1) if when == "before" or n in record.returned]
    with ThreadPoolExecutor(WORKERS) as pool:
        failures += [f for f in pool.map(lambda n: one_kill(tmp_path, op, n, when), points) if f]
    assert not failures, f"{len(failures)} of {len(points)} kill points broke:\n" + "\n".join(
        failures
    )
