"""The public types stay honest: every tests/typing/check_*.py, written the way a user calls
the API (``typing.assert_type`` on what each call returns), passes `mypy --strict`.

The check files are type-checked, never run. One mypy run checks them all (and a canary
with deliberate mistakes, which must be caught: a checker that reports nothing proves
nothing); each file's verdict is its own test.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None, reason="mypy is not installed"
)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHECKS = sorted(HERE.glob("check_*.py"))

CANARY = """\
from pathlib import Path
from typing import assert_type

from atomic_ckpt import Checkpoint, CheckpointDir


class NotAStep:
    pass


def wrong(ckpts: CheckpointDir) -> None:
    assert_type(ckpts.begin(1).publish(), Path)
    assert_type(ckpts.latest(verify=True), Checkpoint)
    ckpts.begin(NotAStep())
"""
CANARY_ERRORS = {
    (12, 'Expression is of type "Checkpoint", not "Path"'),
    (13, 'Expression is of type "Checkpoint | None", not "Checkpoint"'),
    (14, 'incompatible type "NotAStep"; expected "SupportsIndex"'),
}


@pytest.fixture(scope="module")
def mypy_errors(
    tmp_path_factory: pytest.TempPathFactory, mypy_cache_dir: Path
) -> dict[str, list[str]]:
    """Run `mypy --strict` once on every check file and the canary; its errors by file name."""
    scratch = tmp_path_factory.mktemp("mypy")
    canary = scratch / "canary_wrong.py"
    canary.write_text(CANARY)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(REPO / "pyproject.toml"),
            "--no-error-summary",
            "--show-error-codes",
            "--cache-dir",
            str(mypy_cache_dir),
            *map(str, CHECKS),
            str(canary),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    by_file: dict[str, list[str]] = {}
    for line in (result.stdout + result.stderr).splitlines():
        if ": note: " in line:
            continue
        by_file.setdefault(Path(line.split(":", 1)[0]).name, []).append(line)
    return by_file


def test_the_user_facing_api_is_covered() -> None:
    """The check files cover the core, the commit handle, async, torch and the simulation."""
    assert {p.name for p in CHECKS} >= {
        "check_api.py",
        "check_async.py",
        "check_commit.py",
        "check_testing.py",
        "check_torch.py",
    }


@pytest.mark.parametrize("check", CHECKS, ids=lambda p: p.name)
def test_check_file_passes_mypy_strict(mypy_errors: dict[str, list[str]], check: Path) -> None:
    """The file type-checks under `mypy --strict`: every assert_type holds."""
    assert mypy_errors.get(check.name, []) == []


def test_mypy_catches_the_canarys_mistakes_and_reports_nothing_else(
    mypy_errors: dict[str, list[str]],
) -> None:
    """A wrong assert_type and a step that is no SupportsIndex are errors; nothing else is."""
    canary = mypy_errors.get("canary_wrong.py", [])
    found = {(int(line.split(":")[1]), line) for line in canary}
    for lineno, message in CANARY_ERRORS:
        assert any(n == lineno and message in line for n, line in found), (message, canary)
    assert len(canary) == len(CANARY_ERRORS), canary
    others = {name: lines for name, lines in mypy_errors.items() if name != "canary_wrong.py"}
    assert others == {}
