"""The tested ranges the integrations state are the versions CI installs: each
``TESTED_RANGE.oldest`` is pinned in requirements/oldest.in (the oldest run of .ci/run),
each ``newest`` in requirements/test.txt (the main run), and each extra's lower bound in
pyproject.toml is the oldest's minor, with no upper bound. The version check itself:
a version outside the range warns and imports."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the [torch] extra")
pytest.importorskip("transformers", reason="needs the [transformers] extra")
pytest.importorskip("lightning", reason="needs the [lightning] extra")

from packaging.requirements import Requirement
from packaging.version import Version

import atomic_ckpt.integrations
from atomic_ckpt.integrations import _versions
from atomic_ckpt.integrations import accelerate as acc_integration
from atomic_ckpt.integrations import lightning as pl_integration
from atomic_ckpt.integrations import transformers as hf_integration
from atomic_ckpt.integrations._versions import (
    TestedRange,
    UntestedVersionWarning,
    warn_if_untested,
)

REPO = Path(__file__).resolve().parents[2]
RANGES = {
    "transformers": hf_integration.TESTED_RANGE,
    "accelerate": acc_integration.TESTED_RANGE,
    "lightning": pl_integration.TESTED_RANGE,
    "pytorch-lightning": pl_integration.TESTED_RANGE,
}
EXTRAS = {"transformers": "transformers", "accelerate": "accelerate", "lightning": "lightning"}


def pins(path: Path) -> dict[str, str]:
    """``name==version`` lines of a requirements file, by normalized name."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)==([^\s;#]+)", line.strip())
        if match:
            found[re.sub(r"[-_.]+", "-", match[1]).lower()] = match[2]
    return found


def test_the_oldest_and_newest_of_each_range_are_what_ci_installs() -> None:
    """requirements/oldest.in pins every range's oldest, requirements/test.txt its newest."""
    oldest = pins(REPO / "requirements" / "oldest.in")
    newest = pins(REPO / "requirements" / "test.txt")
    for package, tested in RANGES.items():
        assert oldest[package] == tested.oldest, package
        assert newest[package] == tested.newest, package
    # torch: one version is tested, in both runs (atomic_ckpt.dcp warns outside it).
    assert oldest["torch"] == newest["torch"] == "2.13.0"


def test_each_extra_starts_at_its_oldest_and_has_no_upper_bound() -> None:
    """pyproject.toml's extras: ``>=`` the oldest tested minor, nothing capping it."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, package in EXTRAS.items():
        (req,) = [Requirement(r) for r in extras[extra] if Requirement(r).name == package]
        (spec,) = req.specifier
        major, minor = Version(RANGES[package].oldest).release[:2]
        assert (spec.operator, spec.version) == (">=", f"{major}.{minor}"), extra
    # The transformers extra pulls in Accelerate: from the same oldest.
    (acc,) = [r for r in extras["transformers"] if r.startswith("accelerate")]
    assert acc == extras["accelerate"][1]


def test_a_range_covers_its_oldest_up_to_the_newest_minor_series() -> None:
    """In the range: from the oldest through every patch release of the newest's minor."""
    tested = TestedRange("x", "4.47.0", "5.24.0")
    assert all(v in tested for v in ("4.47.0", "4.57.6", "5.0.0", "5.24.0", "5.24.3"))
    assert not any(v in tested for v in ("4.46.3", "4.47.0rc1", "5.25.0", "6.0.0"))
    assert str(tested) == "x 4.47.0 to 5.24.x"


def test_an_untested_version_warns_naming_the_range_and_the_private_methods() -> None:
    """Outside the range: one UntestedVersionWarning naming the version, the range, the
    overridden private methods and a pip command for a tested version; inside, none."""
    tested = TestedRange("fw", "1.2.0", "1.4.0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_if_untested("m", tested, "1.3.1", ["A._b"]) is False
    with pytest.warns(UntestedVersionWarning) as caught:
        assert warn_if_untested("m", tested, "1.5.0", ["A._b", "C._d"]) is True
    (warning,) = caught
    assert str(warning.message) == (
        "m is tested with fw 1.2.0 to 1.4.x, and fw 1.5.0 is installed: it overrides or "
        "reads A._b, C._d, which may have changed. It is imported anyway; if it "
        "misbehaves, install a tested version (pip install 'fw>=1.2.0,<=1.4.0') and report it"
    )
    assert atomic_ckpt.integrations.UntestedVersionWarning is _versions.UntestedVersionWarning


def test_accelerate_outside_its_range_still_imports_with_a_warning() -> None:
    """``import atomic_ckpt.integrations.accelerate`` next to an untested Accelerate
    warns once, naming the version, and the module works (its names are there)."""
    code = (
        "import warnings\n"
        "import accelerate\n"
        "accelerate.__version__ = '99.0.0'\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    from atomic_ckpt.integrations.accelerate import save_state\n"
        "from atomic_ckpt.integrations._versions import UntestedVersionWarning\n"
        "ours = [w for w in caught if w.category is UntestedVersionWarning]\n"
        "assert len(ours) == 1, caught\n"
        "print(ours[0].message)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "accelerate 99.0.0 is installed" in out
    assert f"tested with accelerate {acc_integration.TESTED_RANGE.oldest} to" in out
