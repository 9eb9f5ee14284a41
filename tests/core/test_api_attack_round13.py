"""Round 13 of the outside-in attack on the issue 30 APIs: defects found, each a failing
test marked xfail(strict=True) until it is fixed at its root."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from atomic_ckpt import CheckpointDir, CommitStateError


def test_a_joined_block_left_open_in_a_generator_is_named_as_such(ckpts: CheckpointDir) -> None:
    def part() -> Iterator[int]:
        with ckpts.commit(1, join=True) as path:
            (path / "part.bin").write_bytes(b"p")
            yield 1

    with pytest.raises(CommitStateError) as caught, ckpts.commit(1) as path:  # noqa: PT012
        (path / "a.bin").write_bytes(b"a")
        parts = part()
        next(parts)
    assert ckpts.steps() == []  # nothing half-written was published (holds today)
    assert "still open" in str(caught.value), str(caught.value)
    assert "would wait for itself" not in str(caught.value)


def test_asyncio_tasks_joining_past_the_outer_block_are_named_as_such(
    ckpts: CheckpointDir,
) -> None:
    async def part(n: int) -> None:
        with ckpts.commit(1, join=True) as path:
            await asyncio.sleep(0.01)
            (path / f"p{n}.bin").write_bytes(b"p")

    async def save() -> None:
        tasks = []
        with ckpts.commit(1) as path:
            (path / "a.bin").write_bytes(b"a")
            tasks = [asyncio.create_task(part(n)) for n in (1, 2)]
            await asyncio.sleep(0)
        await asyncio.gather(*tasks)

    with pytest.raises(CommitStateError) as caught:
        asyncio.run(save())
    assert ckpts.steps() == []
    assert "still open" in str(caught.value), str(caught.value)
    assert "would wait for itself" not in str(caught.value)
