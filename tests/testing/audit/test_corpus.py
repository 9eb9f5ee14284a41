"""The audit's self-check: every known-broken save in ``corpus/`` is found broken (exit 1)
or refused (exit 2) as its ``case.json`` says, never called clean.

A case is a directory ``corpus/<item>_<slug>/`` holding ``workload.py`` (run as ``python
workload.py`` with its working directory a temporary copy of the case, writing under
``ckpts/``), ``check.py`` (run as ``python check.py ckpts`` on each crash state, non-zero
when the state is unusable) and ``case.json``: ``{"item": "29.<n>", "expect": "broken" |
"refused", "why": "...", "args": [extra audit arguments, optional]}``. The harness
checks with ``--root ckpts --check-python _check_shim:check``, which runs check.py as
``python check.py ckpts`` would, in the child forked per state (no interpreter start-up
per state: the corpus stays fast); a case's ``args`` come after and may replace the root
or the check (``--check "python check.py ckpts"``: the command form, as the guide's naive
example uses it). An optional
``setup.py`` runs first, untraced, to make the directory the user already has (what git
cannot hold: hard links).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _audit_scripts import needs_strace

pytestmark = needs_strace

CORPUS = Path(__file__).parent / "corpus"
CASES = sorted(p for p in CORPUS.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
EXIT = {"broken": 1, "refused": 2}


def test_the_corpus_is_not_empty() -> None:
    """The self-check checks something: a missing or emptied corpus fails loudly."""
    assert CASES, f"the audit's self-check corpus {CORPUS} holds no case"


def test_every_case_is_well_formed() -> None:
    """Each case has its workload, its check and a case.json that says what to expect."""
    for case in CASES:
        spec = json.loads((case / "case.json").read_text())
        assert (case / "workload.py").is_file(), case
        assert (case / "check.py").is_file(), case
        assert spec["expect"] in EXIT, case
        assert spec["why"], case
        assert str(spec["item"]), case
        assert all(isinstance(a, str) for a in spec.get("args", [])), case


def test_every_false_clean_item_has_a_case() -> None:
    """The definition of done: a case for each of issue 29's false-clean items (1-14), the
    guide's naive example and each plain row of the crash table."""
    items = [str(json.loads((c / "case.json").read_text())["item"]) for c in CASES]
    missing = {f"29.{n}" for n in range(1, 15)} - set(items)
    assert not missing, f"no corpus case for {sorted(missing)}"
    assert "guide" in items
    rows = {c.name.removeprefix("crash_table_") for c in CASES if c.name.startswith("crash_")}
    table = Path(__file__).parents[3] / "benchmarks" / "crash_table"
    # Rows added this round whose torch-free corpus copy is still to be written (a gap,
    # named so that any further row without a case fails here).
    pending = {"hf_final_plain", "lightning_final_plain", "dedup_plain"}
    assert rows | pending == {p.stem for p in table.glob("*_plain.py")}


def audit_case(case: Path, work: Path) -> subprocess.CompletedProcess[str]:
    """``atomic-ckpt audit`` of one case, run in a fresh copy of its directory."""
    spec = json.loads((case / "case.json").read_text())
    args: list[str] = list(spec.get("args", []))
    shutil.copytree(case, work)
    if (work / "setup.py").is_file():
        subprocess.run([sys.executable, "setup.py"], cwd=work, check=True, timeout=60)
    shutil.copy(CORPUS / "_check_shim.py", work)
    own = {"--check", "--check-python"} & set(args)
    check = [] if own else ["--check-python", "_check_shim:check"]
    return subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "audit", "--root", "ckpts", *check, *args,
         "--", sys.executable, "workload.py"],
        cwd=work, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_known_broken_save_is_never_called_clean(case: Path, tmp_path: Path) -> None:
    """The audit finds the case's save broken, or refuses it, as case.json says."""
    spec = json.loads((case / "case.json").read_text())
    run = audit_case(case, tmp_path / case.name)
    said = f"{case.name} ({spec['why']}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert run.returncode != 0, f"called clean: {said}"
    assert run.returncode == EXIT[spec["expect"]], said
    assert "Traceback" not in run.stderr, said
    if spec["expect"] == "refused":
        assert "atomic-ckpt audit: error: " in run.stderr, said
    else:
        assert "BROKEN" in run.stdout, said
