"""A checkpoint's bytes read without reopening its files: a file object over a hashed view,
pickles and safetensors parsed from memory, the dtype names safetensors itself writes."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import math
import mmap
import os
import stat
import warnings
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import torch
from safetensors.torch import save as save_bytes


class _ViewReader(io.RawIOBase):
    """A read-only file over a memoryview (the mapping a verify hashed): what ``torch.load``
    reads verified bytes through, copying only what it asks for."""

    def __init__(self, view: memoryview) -> None:
        self._view = view.cast("B") if view.format != "B" else view
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        out = memoryview(buffer).cast("B")
        chunk = self._view[self._pos : self._pos + len(out)]
        out[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def _mapped(path: Path) -> memoryview | None:
    """``path`` mapped for an unverified load, the kernel told to read all of it ahead: the
    mapping and read-ahead a verified load gets from its hash pass (issue 30 item 21: an
    unverified ``resume()`` must never be slower than a verified one). The loader then
    parses the tensors as views of the mapping and copies each once, into the model (a
    file loader copies twice: into new tensors, then into the model).

    The mapping is private and writable (``torch.frombuffer`` wants a writable buffer;
    nothing writes to it). Opened as ``safetensors`` opens it (a symlink is followed: an
    unverified load of a directory made by hand loads what it names); a missing file is
    FileNotFoundError. None where it cannot be mapped (empty, not a regular file, a
    filesystem without mmap): the caller then reads it by its path."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return None
        try:
            area = mmap.mmap(fd, st.st_size, access=mmap.ACCESS_COPY)
        except (OSError, ValueError):
            return None
    finally:
        os.close(fd)
    if hasattr(mmap, "MADV_WILLNEED"):
        with contextlib.suppress(OSError):  # advice only
            area.madvise(mmap.MADV_WILLNEED)
    return memoryview(area)


def _unmap(view: memoryview) -> None:
    """Let go of a mapping from :func:`_mapped` now, not at the next garbage collection."""
    area = view.obj
    with contextlib.suppress(BufferError):  # a tensor (a traceback's) still holds it:
        view.release()  # then it is freed with that tensor
        if isinstance(area, mmap.mmap):
            area.close()


def _failed(exc: BaseException) -> Future[dict[str, Any]]:
    future: Future[dict[str, Any]] = Future()
    future.set_exception(exc)
    return future


def _load_pickle(f: BinaryIO | io.RawIOBase, path: Path, device: str) -> dict[str, Any]:
    # torch.load reads any object with read/seek/tell (its stubs say IO[bytes]).
    state = torch.load(cast(IO[bytes], f), map_location=device, weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} does not hold a state dict")
    return state


@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    """safetensors' dtype names and the torch dtypes they hold, as the installed safetensors
    writes them (never a hand list, which falls behind: issue 30 found C64 and the fnuz
    float8s missing). Each dtype torch defines is saved once, one element, and the name
    its header records taken; one it cannot save, or that packs several values in an
    element (``F4``'s ``float4_e2m1fn_x2``), is left out."""
    out: dict[str, torch.dtype] = {}
    for value in vars(torch).values():
        if not isinstance(value, torch.dtype):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (complex32, quantized: "experimental")
                data = save_bytes({"t": torch.zeros(1, dtype=value)})
        except Exception:  # (any refusal means: not a dtype it stores)
            continue
        n = int.from_bytes(data[:8], "little")
        info = json.loads(data[8 : 8 + n])["t"]
        if info["shape"] == [1] and info["data_offsets"] == [0, value.itemsize]:
            out.setdefault(info["dtype"], value)
    return out


def _safetensors_tensors(data: memoryview) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file held in ``data``, as views of it (no copy).

    The format: an 8-byte little-endian header length, a JSON header mapping each
    name to its dtype, shape and ``data_offsets`` (from the end of the header), then
    the data. Checked as untrusted input; anything off is a ValueError.
    """
    if len(data) < 8:
        raise ValueError("safetensors data is shorter than its 8-byte header length")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8 or n > 100 << 20:
        raise ValueError(f"safetensors header length {n} does not fit the data")
    try:
        header = json.loads(bytes(data[8 : 8 + n]))
    except (ValueError, RecursionError):
        raise ValueError("safetensors header is not valid JSON") from None
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not an object")
    base, end = 8 + n, len(data)
    out: dict[str, torch.Tensor] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        known = _dtypes()
        if (
            isinstance(info, dict)
            and isinstance(info.get("dtype"), str)
            and (info["dtype"] not in known)
        ):
            raise ValueError(
                f"safetensors entry {name!r} has dtype {info['dtype']!r}, which this "
                f"torch and safetensors cannot load (they know {sorted(known)})"
            )
        try:
            dtype = known[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            start, stop = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"safetensors entry {name!r} is malformed: {info!r}") from None
        count = math.prod(shape)
        size = count * dtype.itemsize
        if not 0 <= start <= stop <= end - base or stop - start != size:
            raise ValueError(f"safetensors entry {name!r} has offsets that do not fit")
        if count == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(data, dtype=dtype, count=count, offset=base + start)
        out[name] = flat.reshape(shape)
    return out
