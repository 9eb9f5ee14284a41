"""The checkpoint a ``dedup=`` or a carry's ``from_=`` names: a name that can never be a
checkpoint is refused before the block writes anything (never after it, throwing the
save away), and in a ``checkpoint-`` root the step as ``ls`` shows it (``"1"``) names
step 1, as it does for ``delete``, ``dir_of``, ``staging`` and ``aliases``."""

from __future__ import annotations

from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir


@pytest.mark.parametrize("bad", ["a/b", ".hidden", "x.tmp-y"])
def test_an_impossible_dedup_name_is_refused_before_the_block(
    ckpts: CheckpointDir, bad: str
) -> None:
    """ValueError (naming the option) when the commit starts; the block never runs."""
    with ckpts.commit(1) as path:
        (path / "f.bin").write_bytes(b"f" * 100)
    ran: list[bool] = []

    def save() -> None:
        with ckpts.commit(2, dedup=bad) as path:
            ran.append(True)
            (path / "f.bin").write_bytes(b"f" * 100)

    with pytest.raises(ValueError, match=r".") as exc:
        save()
    assert ran == []
    assert "dedup" in str(exc.value)


def _prefixed(tmp_path: Path) -> CheckpointDir:
    ckpts = CheckpointDir(tmp_path / "run", prefix="checkpoint-")
    with ckpts.commit(1) as path:
        (path / "f.bin").write_bytes(b"f" * 100)
    assert ckpts.dir_of("1") == ckpts.path_of(1)  # "1" is step 1 elsewhere in the API
    return ckpts


def test_dedup_by_the_step_as_ls_shows_it_in_a_prefixed_root(tmp_path: Path) -> None:
    """``dedup="1"`` dedups against step 1; the commit of step 2 is published."""
    ckpts = _prefixed(tmp_path)
    with ckpts.begin(2, dedup="1") as commit:
        (commit.path / "f.bin").write_bytes(b"f" * 100)
    assert ckpts.steps() == [1, 2]
    assert commit.deduped == {"f.bin": "hardlink"}


def test_carry_from_the_step_as_ls_shows_it_in_a_prefixed_root(tmp_path: Path) -> None:
    """``from_="1"`` carries from step 1, as ``from_="checkpoint-1"`` does."""
    ckpts = _prefixed(tmp_path)
    with ckpts.begin(2) as commit:
        assert commit.carry("f.bin", from_="1") in ("reflink", "hardlink", "copy")
    ckpts.delete(1)
    ckpts.verify(2)
