"""A block joined to an ``amend(step)`` is part of that amend, by the rules of every join:
its ``metadata`` merges into the amended manifest (it was dropped: the amend wrote only
its own), its ``aliases`` are made even where the amend writes no file (a metadata-only
amend dropped them), and its ``dedup=True`` leaves nothing but the caller's files in the
checkpoint (the amend's kept files already share the step's inodes: renaming a second
link of one inode over the first is a no-op, so each ``.<name>.tmp-<hex>`` link stayed in
the committed directory, which then failed ``verify``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from atomic_ckpt import TMP_INFIX, CheckpointDir


def _root(tmp_path: Path) -> CheckpointDir:
    c = CheckpointDir(tmp_path / "ckpts")
    with c.commit(1, metadata={"loss": 1}) as path:
        (path / "model.bin").write_bytes(b"1" * 64)
    with c.commit(2, metadata={"loss": 2}) as path:
        (path / "model.bin").write_bytes(b"2" * 64)
        (path / "optimizer.bin").write_bytes(b"o" * 64)
    return c


@pytest.mark.parametrize("writes", [True, False], ids=["writes-a-file", "metadata-only"])
def test_a_joined_block_s_metadata_and_aliases_reach_the_amended_manifest(
    tmp_path: Path, writes: bool
) -> None:
    """``with amend(2, metadata={"note": ...}): with commit(2, join=True, metadata=
    {"extra": 1}, aliases=["best"])``: the amended manifest holds the step's metadata, the
    amend's and the joined block's; the alias names step 2."""
    c = _root(tmp_path)
    with (
        c.amend(2, metadata={"note": "a"}),
        c.commit(2, join=True, metadata={"extra": 1}, aliases=["best"]) as path,
    ):
        if writes:
            (path / "scheduler.bin").write_bytes(b"s")
    assert c.get(2).manifest.metadata == {"loss": 2, "note": "a", "extra": 1}
    assert c.aliases(2) == ["best"]
    c.verify(2)


def test_a_joined_metadata_key_contradicting_the_amend_s_is_refused(tmp_path: Path) -> None:
    """The amend sets ``note``; a joined block setting it to another value is the
    ValueError every join raises for a contradiction, and the amend publishes nothing."""
    c = _root(tmp_path)
    before = (tmp_path / "ckpts" / "2" / "checkpoint_complete").read_bytes()
    with (
        pytest.raises(ValueError, match="note"),
        c.amend(2, metadata={"note": "a"}),
        c.commit(2, join=True, metadata={"note": "b"}),
    ):
        pass
    assert (tmp_path / "ckpts" / "2" / "checkpoint_complete").read_bytes() == before


def test_dedup_joined_to_an_amend_leaves_no_temporary_link_in_the_checkpoint(
    tmp_path: Path,
) -> None:
    """An amend of step 2 adds a file; a joined block asks for ``dedup=True`` (against
    step 2 itself, whose files the amend kept as links). The checkpoint holds exactly the
    manifest's files and verifies."""
    c = _root(tmp_path)
    with c.amend(2), c.commit(2, join=True, dedup=True) as path:
        (path / "model-copy.bin").write_bytes(b"1" * 64)
    names = sorted(os.listdir(tmp_path / "ckpts" / "2"))
    assert [n for n in names if TMP_INFIX in n] == []
    assert names == ["checkpoint_complete", "model-copy.bin", "model.bin", "optimizer.bin"]
    c.verify(2)
