"""The xxh3-128 of a tensor's bytes: the frozen file's change detection, run on threads
beside the save's writes.

xxhash's binding releases the GIL while it hashes (since xxhash 4.0, the lower bound in
pyproject.toml; 3.x held it, and a hashing thread then stalled the writes beside it), so
the hashes run on another core while this one writes.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
import xxhash

__all__ = ["digest", "digests"]


def digest(tensor: torch.Tensor) -> str:
    """The xxh3-128 hex digest of a contiguous CPU tensor's bytes (as safetensors writes
    them: native, little-endian, order)."""
    if tensor.numel() == 0:
        return xxhash.xxh3_128_hexdigest(b"")
    return xxhash.xxh3_128_hexdigest(tensor.reshape(-1).view(torch.uint8).numpy().data)


def digests(
    tensors: dict[str, torch.Tensor], pool: ThreadPoolExecutor
) -> Callable[[], dict[str, str]]:
    """Start every tensor's :func:`digest` on ``pool`` (the largest first, so that the
    threads finish together); returns the call that waits for them, by name."""
    names = sorted(tensors, key=lambda n: -tensors[n].numel() * tensors[n].element_size())
    parts = [pool.submit(digest, tensors[n]) for n in names]
    return lambda: {n: p.result() for n, p in sorted(zip(names, parts, strict=True))}
