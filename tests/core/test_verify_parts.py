"""verify() in parts (``only``, ``hashed_elsewhere``): processes that split a checkpoint's
files between them check together what one whole verify checks, each byte read once."""

from __future__ import annotations

import os
from collections.abc import Collection
from pathlib import Path

import pytest

from atomic_ckpt import Checkpoint, CheckpointDir, UnusableCheckpointsError, VerificationError
from atomic_ckpt._core.l3_formats import verify as _verify

FILES = {
    "model.rank0.bin": bytes(range(256)) * 8,
    "model.rank1.bin": bytes(range(255, -1, -1)) * 8,
    "sub/config.json": b'{"lr": 0.1}',
    "unread.bin": b"nobody loads this" * 4,
}


@pytest.fixture
def ckpt(ckpts: CheckpointDir) -> Checkpoint:
    """A committed step 5: two per-rank files, a shared one in a subdirectory, a spare."""
    with ckpts.commit(5) as path:
        for rel, data in FILES.items():
            (path / rel).parent.mkdir(exist_ok=True)
            (path / rel).write_bytes(data)
    return ckpts.get(5)


@pytest.fixture
def hashed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths verify reads, whether hashed plainly or mapped to be kept."""
    seen: list[str] = []
    real_hash, real_map = _verify.checksum_file, _verify.map_file

    def checksum_file(path: str, algorithm: str, **kw: object) -> str:
        seen.append(os.fspath(path))
        return real_hash(path, algorithm, **kw)  # type: ignore[arg-type]

    def map_file(path: str, algorithm: str | None, **kw: object) -> object:
        seen.append(os.fspath(path))
        return real_map(path, algorithm, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(_verify, "checksum_file", checksum_file)
    monkeypatch.setattr(_verify, "map_file", map_file)
    return seen


def names(ckpt: Checkpoint, paths: list[str]) -> list[str]:
    return sorted(os.path.relpath(p, ckpt.path) for p in paths)


def damage(ckpt: Checkpoint, rel: str) -> None:
    """Flip the last byte of ``rel``, keeping its size (only a checksum can tell)."""
    data = bytearray((ckpt.path / rel).read_bytes())
    data[-1] ^= 0xFF
    (ckpt.path / rel).write_bytes(bytes(data))


def test_parts_that_cover_the_checkpoint_read_each_file_once(
    ckpt: Checkpoint, hashed: list[str]
) -> None:
    """Rank 0's part (the walk, its own file, the unread one) and rank 1's (its own file and
    the shared one) read every file exactly once between them, and keep what they asked for."""
    mine = {"model.rank1.bin", "sub/config.json"}
    part1 = _verify.verify(ckpt, workers=4, only=mine, keep=mine)
    read1 = names(ckpt, hashed)
    hashed.clear()
    part0 = _verify.verify(ckpt, workers=4, keep={"model.rank0.bin"}, hashed_elsewhere=mine)
    read0 = names(ckpt, hashed)
    assert read1 == sorted(mine)
    assert read0 == ["model.rank0.bin", "unread.bin"]
    assert {k: bytes(v) for k, v in part1.items()} == {p: FILES[p] for p in mine}
    assert {k: bytes(v) for k, v in part0.items()} == {"model.rank0.bin": FILES["model.rank0.bin"]}


def test_a_part_checks_only_its_own_files(ckpt: Checkpoint) -> None:
    """A damaged file outside ``only`` passes there, inside fails; paths the manifest does
    not list are ignored, and a file added beside them is not this part's to report."""
    damage(ckpt, "unread.bin")
    (ckpt.path / "added.bin").write_bytes(b"new")
    mine = {"model.rank1.bin", "not-in-the-manifest.bin"}
    assert set(_verify.verify(ckpt, workers=2, only=mine, keep=mine)) == {"model.rank1.bin"}
    damage(ckpt, "model.rank1.bin")
    with pytest.raises(VerificationError, match="checksum") as info:
        _verify.verify(ckpt, workers=2, only=mine, keep=mine)
    assert info.value.path == ckpt.path / "model.rank1.bin"
    assert len(info.value.problems) == 1


def test_a_part_catches_a_missing_or_resized_file(ckpt: Checkpoint) -> None:
    """``only`` still checks presence and size, not just checksums."""
    (ckpt.path / "sub" / "config.json").unlink()
    (ckpt.path / "model.rank1.bin").write_bytes(b"short")
    with pytest.raises(VerificationError) as info:
        _verify.verify(ckpt, workers=2, only={"model.rank1.bin", "sub/config.json"})
    assert sorted(info.value.problems) == [
        f"{ckpt.path / 'model.rank1.bin'}: size is 5, manifest says 2048",
        f"{ckpt.path / 'sub/config.json'}: missing",
    ]


def test_a_part_never_reads_through_a_symlinked_directory(
    ckpt: Checkpoint, tmp_path: Path, hashed: list[str]
) -> None:
    """A subdirectory swapped for a symlink to an identical copy fails, and the copy is not
    read: each directory on the way is looked up without following a link."""
    copy = tmp_path / "elsewhere"
    copy.mkdir()
    (copy / "config.json").write_bytes(FILES["sub/config.json"])
    (ckpt.path / "sub" / "config.json").unlink()
    (ckpt.path / "sub").rmdir()
    (ckpt.path / "sub").symlink_to(copy)
    with pytest.raises(VerificationError, match="not a directory"):
        _verify.verify(ckpt, workers=2, only={"sub/config.json"}, keep={"sub/config.json"})
    assert hashed == []


def test_hashed_elsewhere_is_sized_but_not_read(ckpt: Checkpoint, hashed: list[str]) -> None:
    """A file another process hashes: its damage is that process's to find, but a wrong size
    or an added file is still found by the walk, and nothing of it is read here."""
    damage(ckpt, "model.rank1.bin")
    _verify.verify(ckpt, workers=2, hashed_elsewhere={"model.rank1.bin"})
    assert "model.rank1.bin" not in names(ckpt, hashed)
    (ckpt.path / "model.rank1.bin").write_bytes(b"short")
    (ckpt.path / "added.bin").write_bytes(b"new")
    with pytest.raises(VerificationError) as info:
        _verify.verify(ckpt, workers=2, hashed_elsewhere={"model.rank1.bin", "added.bin"})
    assert sorted(info.value.problems) == [
        f"{ckpt.path / 'added.bin'}: not in the manifest (added after the commit)",
        f"{ckpt.path / 'model.rank1.bin'}: size is 5, manifest says 2048",
    ]


def test_a_part_reports_progress_of_its_own_bytes(ckpt: Checkpoint) -> None:
    """``progress`` with ``only`` counts the part's bytes: from 0 up to their total."""
    calls: list[tuple[int, int]] = []
    _verify.verify(
        ckpt, workers=2, only={"model.rank1.bin"}, progress=lambda d, t: calls.append((d, t))
    )
    assert calls[0] == (0, 2048)
    assert calls[-1] == (2048, 2048)


def test_resume_verified_asks_the_verifier_newest_first(
    ckpts: CheckpointDir, ckpt: Checkpoint, caplog: pytest.LogCaptureFixture
) -> None:
    """``resume_verified(verifier=...)``: a candidate it rejects is skipped with the warning
    and an older one is tried; its views are what the resume returns; all rejected and
    nothing else there is the refusal of ``resume_point``."""
    with ckpts.commit(7) as path:
        (path / "model.rank0.bin").write_bytes(b"newer")
    asked: list[tuple[int, frozenset[str]]] = []

    def verifier(c: Checkpoint, read: Collection[str]) -> dict[str, memoryview]:
        asked.append((c.step, frozenset(read)))
        if c.step == 7:
            raise VerificationError("rank 1: damaged on purpose", path=c.path, step=c.step)
        return {"model.rank0.bin": memoryview(b"views")}

    found = ckpts.resume_verified(["model.rank0.bin"], verifier=verifier)
    assert found is not None
    assert found.checkpoint.step == ckpt.step
    assert bytes(found.files["model.rank0.bin"]) == b"views"
    assert asked == [(7, frozenset({"model.rank0.bin"})), (5, frozenset({"model.rank0.bin"}))]
    assert any("rank 1: damaged on purpose" in r.getMessage() for r in caplog.records)

    def rejects(c: Checkpoint, read: Collection[str]) -> dict[str, memoryview]:
        raise VerificationError("no", path=c.path, step=c.step)

    with pytest.raises(UnusableCheckpointsError, match="does not verify"):
        ckpts.resume_verified(["model.rank0.bin"], verifier=rejects)
    assert ckpts.resume_verified(["model.rank0.bin"], verifier=rejects, fresh=True) is None
