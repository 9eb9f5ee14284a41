"""The [gcs] and [azure] extras' lower bounds are what CI tests as the oldest, and the main
run tests a newer one: requirements/oldest-cloud.in pins each client at pyproject.toml's
bound (.ci/oldest_cloud.sh runs the gs:// and az:// tests with it), requirements/test.txt
pins the newest (the main run), and .ci/run runs both. No client needed: files only."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
CLIENTS = {"gcs": "google-cloud-storage", "azure": "azure-storage-blob"}


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by normalized name."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return found


def lower_bound(extra: str, package: str) -> str:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    (req,) = [Requirement(r) for r in extras[extra] if Requirement(r).name == package]
    (spec,) = req.specifier  # one specifier: >= the oldest, no upper bound
    assert spec.operator == ">=", (extra, str(req))
    return spec.version


@pytest.mark.parametrize("extra", sorted(CLIENTS))
def test_the_oldest_run_installs_each_extras_lower_bound(extra: str) -> None:
    """oldest-cloud.in pins the client at the extra's lower bound, oldest-cloud.txt (what
    it resolved to) agrees, and the main run's pin is newer."""
    package = CLIENTS[extra]
    bound = Version(lower_bound(extra, package))
    oldest = pins(REPO / "requirements" / "oldest-cloud.in")[package]
    assert Version(oldest) == bound, (package, oldest, str(bound))
    assert pins(REPO / "requirements" / "oldest-cloud.txt")[package] == oldest
    newest = pins(REPO / "requirements" / "test.txt")[package]
    assert Version(newest) > bound, (package, newest)


def test_ci_runs_the_oldest_clients() -> None:
    """.ci/run has a stage that runs .ci/oldest_cloud.sh, and that script installs only the
    two cloud extras (no torch, no s3fs) from the pinned files."""
    assert "bash .ci/oldest_cloud.sh" in (REPO / ".ci" / "run").read_text()
    script = (REPO / ".ci" / "oldest_cloud.sh").read_text()
    assert "-c requirements/oldest-cloud.txt" in script
    assert "-r requirements/oldest-cloud.in" in script
    assert "-e '.[gcs,azure]'" in script
    assert "torch" not in pins(REPO / "requirements" / "oldest-cloud.txt")
