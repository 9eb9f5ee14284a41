"""The committed results of ``benchmarks/incremental.py`` and what is said about them agree:
its ``--help`` describes every case the results hold (not a sentence cut at a line
break), and the incremental guide quotes the committed ratios, the dedup case's included
(no timing is run here)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "incremental.py"
RESULTS = REPO / "benchmarks" / "results" / "incremental.json"
GUIDE = REPO / "docs" / "guides" / "incremental.md"


def _rows() -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["case"], r["method"]): r for r in json.loads(RESULTS.read_text())}


def _guide_row(case: str) -> list[str]:
    """The cells of the guide's carry table row for ``case``."""
    for line in GUIDE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == case and len(cells) == 5:
            return cells[1:]
    raise AssertionError(f"the guide has no carry table row for {case!r}")


def test_help_describes_every_case_of_the_committed_results() -> None:
    """``--help`` names each case and method the results hold, in whole sentences."""
    pytest.importorskip("torch")
    pytest.importorskip("safetensors")
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO / "benchmarks",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = " ".join(proc.stdout.split())
    description = text.split("options:")[0]
    assert re.search(r"side by side in one process\.", description), description
    for case, method in _rows():
        assert case in text, case
        assert method in text, (case, method)
    for option in ("--scale", "--repeats", "--work", "--out"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.strip().startswith(option))
        assert len(line.split()) > 2, f"{option} has no help text: {line!r}"


@pytest.mark.parametrize("case", ["draft", "adapter"])
def test_the_guide_quotes_the_committed_carry_ratios(case: str) -> None:
    """The guide's carry table is the committed results' ratios (rounded as the md does)."""
    rows = _rows()
    full, carry, ideal = (rows[(case, m)] for m in ("full", "carry", "ideal"))
    floor = full["disk_bytes"] / 5 + 4 * ideal["disk_bytes"] / 5
    expected = [
        f"{carry['bytes_written'] / ideal['bytes_written']:.3f}",
        f"{carry['median_s'] / ideal['median_s']:.2f}",
        f"{carry['bytes_written'] / full['bytes_written']:.3f}",
        f"{carry['disk_bytes'] / floor:.3f}",
    ]
    assert _guide_row(case) == expected


def test_the_guide_quotes_the_committed_dedup_figures() -> None:
    """The identical case's disk per extra checkpoint and hashing cost are in the guide,
    as committed, beside their targets."""
    dedup = _rows()[("identical", "dedup")]
    text = " ".join(GUIDE.read_text().split())
    assert f"{dedup['disk_per_extra'] * 100:.3f}%" in text
    assert f"{dedup['hash_cost'] * 100:.0f}%" in text
    assert "5%" in text
