"""A carry from an alias (a symlink in the root naming a step: ``aliases=["best"]``, or
the ``checkpoint_best`` pointer) is refused with a message naming the step the alias
points to and the ``from_=`` that carries from it, instead of "no complete checkpoint"
(or a ValueError about reserved names); nothing is staged."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError


def _leftovers(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if ".tmp-" in n)


@pytest.fixture
def aliased(ckpts: CheckpointDir) -> CheckpointDir:
    """Step 1 with the alias ``best`` and the ``checkpoint_best`` pointer naming it."""
    with ckpts.commit(1, aliases=["best"]) as path:
        (path / "frozen.bin").write_bytes(b"f" * 4096)
    ckpts.set_best(1)
    return ckpts


@pytest.mark.parametrize("alias", ["best", "checkpoint_best"])
def test_a_carry_from_an_alias_names_the_step_to_carry_from(
    aliased: CheckpointDir, alias: str
) -> None:
    """CheckpointNotFoundError saying it is an alias of step 1 and to pass from_=1."""
    with aliased.begin(2) as commit:
        with pytest.raises(CheckpointNotFoundError, match=r"alias.*step 1.*from_=1"):
            commit.carry("frozen.bin", from_=alias)
        (commit.path / "t.bin").write_bytes(b"t")
    assert sorted(os.listdir(aliased.path_of(2))) == ["checkpoint_complete", "t.bin"]
    assert _leftovers(aliased.root) == []


def test_the_carry_argument_of_commit_says_the_same(aliased: CheckpointDir) -> None:
    """``commit(2, carry={...: "best"})`` is refused the same way, before the block runs."""
    with (
        pytest.raises(CheckpointNotFoundError, match=r"from_=1"),
        aliased.commit(2, carry={"frozen.bin": "best"}),
    ):
        raise AssertionError("the block ran")
    assert aliased.steps() == [1]
    assert _leftovers(aliased.root) == []


def test_the_step_the_alias_names_carries(aliased: CheckpointDir) -> None:
    """What the message says to do works."""
    with aliased.begin(2) as commit:
        assert commit.carry("frozen.bin", from_=1) in ("reflink", "hardlink", "copy")
    aliased.verify(2)
