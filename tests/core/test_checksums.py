"""Hashing a file through a read-only mapping (a commit's own staging files) gives exactly
what reading it gives, and falls back to reading wherever a mapping is not made."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt._core.l2_syscalls import checksums as _checksums

SIZES = [0, 1, (1 << 20) - 1, 1 << 20, (9 << 20) + 123]
"""Empty, tiny, just under and at the mapping threshold, and more than one 8 MiB chunk."""


@pytest.fixture
def mappings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of every mapping the checksum code makes (the real mmap is used)."""
    made: list[int] = []
    real = mmap.mmap

    def recording(fd: int, length: int, *args: Any, **kwargs: Any) -> mmap.mmap:
        made.append(length)
        return real(fd, length, *args, **kwargs)

    monkeypatch.setattr(_checksums.mmap, "mmap", recording)
    return made


@pytest.mark.parametrize("algorithm", sorted(_checksums.CHECKSUMS))
@pytest.mark.parametrize("size", SIZES)
def test_a_mapped_checksum_equals_the_read_one(
    tmp_path: Path, algorithm: str, size: int, mappings: list[int]
) -> None:
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    read = _checksums.checksum_file(path, algorithm)
    assert mappings == []  # reading never maps
    assert _checksums.checksum_file(path, algorithm, mapped=True) == read
    assert _checksums.hashed_size() == size
    assert mappings == ([size] if size >= 1 << 20 else [])


def test_a_file_that_cannot_be_mapped_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mmap failing (a filesystem without it: ENODEV) is not an error: the file is read."""
    path = tmp_path / "f"
    path.write_bytes(os.urandom(3 << 20))
    refused: list[int] = []

    def no_mmap(fd: int, length: int, *args: Any, **kwargs: Any) -> mmap.mmap:
        refused.append(length)
        raise OSError(errno.ENODEV, "no mmap here")

    expected = _checksums.checksum_file(path, "xxh3_128")
    monkeypatch.setattr(_checksums.mmap, "mmap", no_mmap)
    assert _checksums.checksum_file(path, "xxh3_128", mapped=True) == expected
    assert refused == [3 << 20]


def test_a_commit_hashes_its_large_files_through_a_mapping(
    ckpts: CheckpointDir, mappings: list[int]
) -> None:
    """Step 3 maps the staging files it hashes (large ones), and the manifest holds the
    same digests a reading verify() computes."""
    with ckpts.commit(1) as path:
        (path / "big.bin").write_bytes(os.urandom(2 << 20))
        (path / "small.bin").write_bytes(b"s" * 10)
        (path / "sub").mkdir()
        (path / "sub" / "large.bin").write_bytes(os.urandom((1 << 20) + 5))
    assert sorted(mappings) == [(1 << 20) + 5, 2 << 20]
    mappings.clear()
    ckpts.verify(1)  # reads every file again and compares
    assert mappings == []


def test_adopting_or_syncing_a_foreign_directory_never_maps_its_files(
    tmp_path: Path, mappings: list[int]
) -> None:
    """mark_complete() and the public sync_tree()/sync_files() take directories this
    process may not have written (another may still truncate a file there): they read,
    so such a truncation is at worst a wrong checksum, never a SIGBUS."""
    ckpts = CheckpointDir(tmp_path / "root")
    foreign = ckpts.root / "7"
    foreign.mkdir(parents=True)
    (foreign / "big.bin").write_bytes(os.urandom(2 << 20))
    ckpts.mark_complete(7)
    ckpts.sync_tree(foreign)
    ckpts.sync_files(foreign, ["big.bin"])
    assert mappings == []
    ckpts.verify(7)


@pytest.mark.parametrize("size", [0, 1, 2 << 20, (5 << 20) + 7, 6 << 20])
@pytest.mark.parametrize("mapped", [True, False])
def test_ahead_is_called_once_per_range_before_that_range_is_hashed(
    tmp_path: Path, mapped: bool, size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ahead(offset, length)`` covers the file in consecutive AHEAD-sized ranges from 0,
    each announced before any of its bytes is hashed, mapped or read; the digest is the
    same as without it."""
    monkeypatch.setattr(_checksums, "AHEAD", 2 << 20)  # small, still a multiple of chunks
    monkeypatch.setattr(_checksums, "_MAP_CHUNK", 1 << 20)
    path = tmp_path / "f"
    path.write_bytes(os.urandom(size))
    calls: list[tuple[int, int]] = []
    hashed: list[int] = []  # bytes hashed when each call came
    real_hashers = dict(_checksums._HASHERS)

    class Counting:
        def __init__(self) -> None:
            self.inner = real_hashers["xxh3_128"]()
            self.n = 0

        def update(self, data: Any) -> None:
            self.n += len(data)
            counting[0] = self.n
            self.inner.update(data)

        def hexdigest(self) -> str:
            return str(self.inner.hexdigest())

    counting = [0]
    monkeypatch.setitem(_checksums._HASHERS, "xxh3_128", Counting)

    def ahead(offset: int, length: int) -> None:
        calls.append((offset, length))
        hashed.append(counting[0])

    digest = _checksums.checksum_file(path, "xxh3_128", mapped=mapped, ahead=ahead)
    step = 2 << 20
    ranges = range(0, size, step)  # none for an empty file, none past the end
    assert calls == [(offset, step) for offset in ranges]
    assert hashed == list(ranges)  # each range announced before any of it is hashed
    monkeypatch.setitem(_checksums._HASHERS, "xxh3_128", real_hashers["xxh3_128"])
    assert digest == _checksums.checksum_file(path, "xxh3_128")
