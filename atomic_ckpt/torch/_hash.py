"""The xxh3-128 of a tensor's bytes, off the GIL where it can be: the frozen file's change
detection, run on threads beside the save's writes.

The Python binding (``xxhash.xxh3_128_hexdigest``) holds the GIL while it hashes, so a
hashing thread stalls the writes it runs beside (measured: the safetensors write of the
trainable part took ~30% longer). The same extension exports xxHash's C function
``XXH3_128bits``; called through ctypes, which releases the GIL, the hashes run on the
second core while this one writes. Checked once against the binding (same digest of a
probe) and used only then; otherwise every digest is the binding's, unchanged.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch
import xxhash

__all__ = ["digest", "digests"]


class _XXH128(ctypes.Structure):
    _fields_ = (("low64", ctypes.c_uint64), ("high64", ctypes.c_uint64))


_CFunction = Callable[[int, int], _XXH128]


@functools.cache
def _c_xxh3_128() -> _CFunction | None:
    """``XXH3_128bits(data, length)`` of the loaded xxhash extension, or None if it does
    not export it or it disagrees with the binding on a probe."""
    try:
        from xxhash import _xxhash  # type: ignore[attr-defined]  # (the extension itself)

        fn = ctypes.CDLL(_xxhash.__file__).XXH3_128bits
    except (ImportError, OSError, AttributeError):
        return None
    fn.restype = _XXH128
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    probe = bytes(range(256)) * 17  # (over XXH3's 240-byte short-input path)
    buffer = ctypes.create_string_buffer(probe, len(probe))
    if _hex(fn(ctypes.addressof(buffer), len(probe))) != xxhash.xxh3_128_hexdigest(probe):
        return None
    return fn


def _hex(value: _XXH128) -> str:
    """As ``hexdigest()`` writes it: the canonical (big-endian) high then low half."""
    return f"{value.high64:016x}{value.low64:016x}"


def digest(tensor: torch.Tensor) -> str:
    """The xxh3-128 hex digest of a contiguous CPU tensor's bytes (as safetensors writes
    them: native, little-endian, order)."""
    size = tensor.numel() * tensor.element_size()
    if size == 0:
        return xxhash.xxh3_128_hexdigest(b"")
    fn = _c_xxh3_128()
    if fn is not None:
        return _hex(fn(tensor.data_ptr(), size))
    data = tensor.reshape(-1).view(torch.uint8).numpy()
    return xxhash.xxh3_128_hexdigest(data.data)


def digests(
    tensors: dict[str, torch.Tensor], pool: ThreadPoolExecutor
) -> Callable[[], dict[str, str]]:
    """Start every tensor's :func:`digest` on ``pool`` (the largest first, so that the
    threads finish together); returns the call that waits for them, by name."""
    names = sorted(tensors, key=lambda n: -tensors[n].numel() * tensors[n].element_size())
    parts = [pool.submit(digest, tensors[n]) for n in names]
    return lambda: {n: p.result() for n, p in sorted(zip(names, parts, strict=True))}
