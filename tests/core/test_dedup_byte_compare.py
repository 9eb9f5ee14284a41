"""Dedup's byte comparison of a previous file with the one written (``dedup._same_bytes``):
exact at every chunk boundary, and reading into two reused buffers, never a new object per
chunk (the per-chunk allocations made it cost six times a plain read of both files)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from atomic_ckpt._core.l4_protocol import dedup

CHUNK = dedup._CHUNK


def _pair(tmp_path: Path, a: bytes, b: bytes) -> tuple[Path, Path]:
    pa, pb = tmp_path / "a", tmp_path / "b"
    pa.write_bytes(a)
    pb.write_bytes(b)
    return pa, pb


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
def test_equal_files_compare_equal_at_every_chunk_boundary(tmp_path: Path, size: int) -> None:
    """Two files with the same bytes are the same, whatever their size is in chunks."""
    data = bytes(i % 251 for i in range(size))
    assert dedup._same_bytes(*_pair(tmp_path, data, data))


@pytest.mark.parametrize("size", [1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
@pytest.mark.parametrize("where", ["first", "last"])
def test_one_byte_changed_anywhere_compares_different(
    tmp_path: Path, size: int, where: str
) -> None:
    """A single flipped byte, in the first or the last (maybe partial) chunk, is seen."""
    data = bytes(i % 251 for i in range(size))
    at = 0 if where == "first" else size - 1
    other = data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
    assert not dedup._same_bytes(*_pair(tmp_path, data, other))


@pytest.mark.parametrize("extra", [1, CHUNK])
def test_a_file_that_is_a_prefix_of_the_other_compares_different(
    tmp_path: Path, extra: int
) -> None:
    """Equal bytes as far as the shorter file goes do not make two files the same."""
    data = bytes(i % 251 for i in range(2 * CHUNK))
    longer = data + b"\0" * extra
    assert not dedup._same_bytes(*_pair(tmp_path, data, longer))
    assert not dedup._same_bytes(*_pair(tmp_path, longer, data))


def test_the_comparison_holds_two_chunks_whatever_the_file_size(tmp_path: Path) -> None:
    """Comparing two 16-chunk files allocates its two buffers once: at most about two
    chunks of memory at its peak, never a new pair of chunks per read."""
    data = bytes(i % 251 for i in range(16 * CHUNK))
    pa, pb = _pair(tmp_path, data, data)
    del data
    tracemalloc.start()
    try:
        assert dedup._same_bytes(pa, pb)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * CHUNK + CHUNK // 4, f"peak {peak} bytes for chunks of {CHUNK}"
