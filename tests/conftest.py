"""Fixtures shared by every test module."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir


@pytest.fixture
def ckpts(tmp_path: Path) -> CheckpointDir:
    """A CheckpointDir on a fresh root (not yet created on disk)."""
    return CheckpointDir(tmp_path / "ckpts")


@pytest.fixture
def umask_027() -> Iterator[int]:
    """Run the test under umask 0o027 (group loses write, others lose everything)."""
    old = os.umask(0o027)
    try:
        yield 0o027
    finally:
        os.umask(old)
