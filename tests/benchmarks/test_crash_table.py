"""The crash table's workloads and checks, run once each without a crash: they cannot rot.

Every workload makes its three saves (save 3 fails on a full disk, as meant) and its
check, run on the tree it left, loads save 2 through the framework's resume path, except
where the plain save path's failed save itself leaves the newest checkpoint unloadable
(found here with no crash at all). The checks' judgement is specified on its own below.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "benchmarks" / "crash_table"
sys.path.insert(0, str(SCRIPTS))

import _common  # noqa: E402

FINAL = {
    # workload (script, flags): what its check says about the tree the uncrashed run left
    ("torchsave_plain", ""): "VIOLATION cannot load ckpt-2.pt",
    ("torchsave_atomic", ""): "loaded save 2 from ckpt-1.pt",
    ("stepdir_plain", ""): "VIOLATION cannot load ckpt/2/",
    ("stepdir_atomic", ""): "loaded save 2 from ckpt/1/",
    ("hf_plain", ""): "VIOLATION cannot resume from ckpt/checkpoint-2",
    ("hf_atomic", ""): "loaded save 2 from ckpt/checkpoint-1",
    ("lightning_plain", ""): "loaded save 2 from last.ckpt",
    ("lightning_atomic", ""): "loaded save 2 from last.ckpt",
    ("lightning_atomic", "--async"): "loaded save 2 from last.ckpt",
    ("dcp_plain", ""): "VIOLATION cannot load ckpt/2/",
    ("dcp_atomic", ""): "loaded save 2 from ckpt/1/",
    ("dcp_atomic", "--async"): "loaded save 2 from ckpt/1/",
    # The final saves (a script's save_model + save_state; trainer.save_checkpoint by hand).
    ("hf_final_plain", ""): "loaded save 2 from ckpt/",
    ("hf_final_atomic", ""): "loaded save 2 from ckpt/",
    ("lightning_final_plain", ""): "loaded save 2 from final.ckpt",
    ("lightning_final_atomic", ""): "loaded save 2 from final.ckpt",
    ("lightning_final_atomic", "--async"): "loaded save 2 from final.ckpt",
}


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(SCRIPTS)])}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def _save_and_check(script: str, flags: str, root: Path) -> tuple[str, str]:
    proc = _run([str(SCRIPTS / f"{script}.py"), "save+check", str(root), *flags.split()])
    verdict = (proc.stdout + proc.stderr).strip().splitlines()
    line = next((v for v in verdict if v.startswith(("VIOLATION", "loaded", "fresh"))), "")
    assert proc.returncode == (1 if line.startswith("VIOLATION") else 0), proc.stderr[-3000:]
    return proc.stdout, line


@pytest.mark.slow  # the slow tier (docs/contributing.md): python -m pytest -m slow
@pytest.mark.parametrize(("script", "flags"), list(FINAL), ids=[f"{s}{f}" for s, f in FINAL])
def test_every_workload_saves_three_times_and_its_check_judges_the_result(
    tmp_path: Path, script: str, flags: str
) -> None:
    """Each workload exits 0 with save 3 failed as intended and a journal of the three
    saves; its check (exit 1 exactly on a violation) gives the verdict of FINAL. One test
    per workload, so the workers share them out (one test of all of them, two at a time,
    was the slow tier's longest)."""
    stdout, verdict = _save_and_check(script, flags, tmp_path / f"{script}{flags}")
    assert "save 3 failed as intended" in stdout, (script, flags)
    journal = _common.Journal.read(tmp_path / f"{script}{flags}")
    assert sorted(journal.begun.values()) == [1, 2, 3], (script, flags)
    assert journal.returned == {1, 2}, (script, flags)
    assert verdict.startswith(FINAL[script, flags]), (script, flags, verdict)


def _journal(tmp_path: Path, *entries: str) -> Path:
    (tmp_path / _common.JOURNAL).mkdir()
    for entry in entries:
        (tmp_path / _common.JOURNAL / entry).touch()
    return tmp_path


def test_a_fresh_start_is_fine_until_a_save_has_returned(tmp_path: Path) -> None:
    """Nothing to load: fine while no save returned, a lost commit once one did."""
    root = _journal(tmp_path, "begin-1-aaaa")
    assert _common.judge(root, None, "ckpt/") == "fresh start"
    (root / _common.JOURNAL / "returned-1").touch()
    with pytest.raises(_common.Violation, match="lost commit: save 1 returned"):
        _common.judge(root, None, "ckpt/")


def test_a_state_that_no_save_wrote_is_a_violation(tmp_path: Path) -> None:
    """A loaded digest that no ``begin`` line recorded is bytes of no single save."""
    root = _journal(tmp_path, "begin-1-aaaa", "returned-1", "begin-2-bbbb")
    assert _common.judge(root, "aaaa", "x") == "loaded save 1 from x"
    assert _common.judge(root, "bbbb", "x") == "loaded save 2 from x"
    with pytest.raises(_common.Violation, match="bytes of no single save"):
        _common.judge(root, "cccc", "x")


def test_an_older_save_than_one_that_returned_is_a_lost_commit(tmp_path: Path) -> None:
    """Loading save 1 after save 2 returned: the rewrite was taken back."""
    root = _journal(tmp_path, "begin-1-aaaa", "returned-1", "begin-2-bbbb", "returned-2")
    with pytest.raises(_common.Violation, match="holds save 1, but save 2 had returned"):
        _common.judge(root, "aaaa", "x")


def test_a_missing_journal_is_a_fresh_start_and_strangers_are_ignored(tmp_path: Path) -> None:
    """No journal directory (nothing began), or names that are no entry: nothing recorded."""
    assert _common.Journal.read(tmp_path).begun == {}
    root = _journal(tmp_path, "begin-1-aaaa", "returned-x", ".tmp", "begin-2")
    journal = _common.Journal.read(root)
    assert journal.begun == {"aaaa": 1}
    assert journal.returned == set()


def _record(row: str, column: str, kill: int, power: int) -> dict[str, object]:
    return {
        "row": row,
        "column": column,
        "variant": "",
        "workload": f"benchmarks/crash_table/{row}_{column}.py save ROOT",
        "operations": 10,
        "states": {"kill": 20, "power": 30},
        "violations": {"kill": kill, "power": power},
        "kinds": {"kill": {"cannot load": kill} if kill else {}, "power": {}},
        "timings": {"record": 1.0, "build": 0.1, "checks": 2.0},
        "seconds": 3.5,
    }


@pytest.mark.parametrize("atomic_violations", [0, 2])
def test_the_table_renders_from_its_json_and_fails_on_an_atomic_violation(
    tmp_path: Path, atomic_violations: int
) -> None:
    """--render rebuilds the Markdown table and the chart from crash_table.json alone, and
    exits 1 when a "with atomic_ckpt" cell has a violation (0 otherwise)."""
    pytest.importorskip("matplotlib")
    import json

    records = [_record("torchsave", "plain", 3, 4), _record("torchsave", "atomic_ckpt", 0, 0)]
    records[1]["violations"] = {"kill": 0, "power": atomic_violations}
    meta = {"when": "now", "machine": "here", "jobs": 1, "command": "python x"}
    (tmp_path / "crash_table.json").write_text(json.dumps({"meta": meta, "cells": records}))
    proc = _run([str(ROOT / "benchmarks" / "crash_table.py"), "--render", "--out", str(tmp_path)])
    assert proc.returncode == (1 if atomic_violations else 0), proc.stderr[-2000:]
    table = (tmp_path / "crash_table.md").read_text()
    line = f"| kill 3/20, power 4/30 | `atomic_write`: kill 0/20, power {atomic_violations}/30 |"
    assert line in table
    assert (tmp_path / "crash_table.png").stat().st_size > 0
