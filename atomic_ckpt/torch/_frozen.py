"""Frozen weights in a file of their own, carried from the previous checkpoint when none
changed: the split of a model's state, the per-tensor hashes, the carry, and the load of
both files.

With ``save_state(..., carry_frozen=True)`` the model's state goes into two safetensors
files: :data:`FROZEN_FILE` holds the frozen parameters (``requires_grad=False``) and the
buffers named in ``constant_buffers``, with the xxh3-128 hash of each tensor's bytes in
its metadata; ``model.safetensors`` holds the rest and names the frozen file in its own
metadata (so a load knows it needs both, and a lone stale file is never loaded). Before
writing the frozen file, the hashes (and each tensor's dtype and shape) are compared with
the frozen file of the newest complete checkpoint before this step; all equal, that file
is carried (:meth:`Commit.carry <atomic_ckpt.Commit.carry>`: reflink, hard link or copy,
after checking it still is the committed file) instead of written.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, SupportsIndex

import torch
from safetensors.torch import load_file, save_file

from atomic_ckpt import (
    Checkpoint,
    CheckpointDir,
    CheckpointNotFoundError,
    Commit,
    ManifestError,
    StepConflictError,
    VerificationError,
)
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt.torch import _hash
from atomic_ckpt.torch._bytes import _dtypes, _mapped, _safetensors_tensors

FROZEN_FILE = "frozen.safetensors"
"""The frozen parameters and constant buffers (``save_state(..., carry_frozen=True)``)."""
HASHES_KEY = "atomic_ckpt.xxh3_128"
"""The frozen file's metadata key: JSON ``{tensor name: xxh3-128 hex of its bytes}``."""
MODEL_FILE = "model.safetensors"
"""The rest of the model's state (``atomic_ckpt.torch.MODEL_FILE``)."""
FROZEN_KEY = "atomic_ckpt.frozen_file"
"""The model file's metadata key naming the frozen file that goes with it."""

log = logging.getLogger("atomic_ckpt.torch")

Tensors = dict[str, torch.Tensor]
Described = dict[str, tuple[str, tuple[int, ...], str]]
"""Each frozen tensor's safetensors dtype name, shape and hash: what must all match."""


def save(
    ckpts: CheckpointDir,
    step: SupportsIndex,
    *,
    model: torch.nn.Module,
    constant: frozenset[str],
    metadata: Mapping[str, Any] | None,
    write_rest: Callable[[Path], None],
    replace_unusable: bool = False,
) -> Checkpoint:
    """``save_state(..., carry_frozen=True)``: the frozen tensors hashed on threads
    (off the GIL: :mod:`._hash`) while the model file and the other files
    (``write_rest(directory)``) are written and their writeback started (a hint: the
    publish still fsyncs them), then the frozen file carried or written."""
    with ckpts.begin(step, metadata=metadata, replace_unusable=replace_unusable) as commit:
        rest, frozen = split(model, constant)
        threads = min(4, os.cpu_count() or 1)
        with ThreadPoolExecutor(threads, thread_name_prefix="atomic_ckpt-hash") as pool:
            hashes = _hash.digests(frozen, pool)
            meta = {FROZEN_KEY: FROZEN_FILE} if frozen else None
            save_file(rest, str(commit.path / MODEL_FILE), metadata=meta)
            write_rest(commit.path)
            for entry in os.scandir(commit.path):  # the disk works while the hash ends
                _fs.start_file_writeback(entry.path)
            if frozen:
                place(ckpts, commit, frozen, hashes())
            else:
                log.info(
                    "step %d: the model has no frozen tensors: no %s",
                    step,
                    FROZEN_FILE,
                    extra={"frozen_file": "none"},
                )
    return commit.publish()


def check_options(
    model: object, carry_frozen: object, constant_buffers: Collection[str]
) -> frozenset[str]:
    """The constant buffers' names, checked against ``model``: TypeError or ValueError
    saying what is wrong (a name that is no saved buffer, a parameter, a lone string)."""
    if not isinstance(carry_frozen, bool):
        raise TypeError(f"carry_frozen takes True or False, got {carry_frozen!r}")
    if isinstance(constant_buffers, (str, bytes)) or not isinstance(constant_buffers, Collection):
        raise TypeError(
            "constant_buffers takes a collection of buffer names (as model.state_dict() "
            f"names them), e.g. ['rope.inv_freq'], got {constant_buffers!r}"
        )
    names = frozenset(constant_buffers)
    if names and not carry_frozen:
        raise ValueError(
            "constant_buffers only applies with carry_frozen=True (it says which buffers "
            "go into the frozen file): pass carry_frozen=True, or drop constant_buffers"
        )
    if not carry_frozen:
        return names
    if not isinstance(model, torch.nn.Module):
        raise TypeError(
            "carry_frozen=True splits the model's frozen tensors into a file of their own: "
            f"it needs model=<a torch.nn.Module>, got {type(model).__name__}"
        )
    saved = model.state_dict().keys()
    buffers = {n for n, _ in model.named_buffers(remove_duplicate=False)}
    params = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    for name in sorted(names):
        if not isinstance(name, str):
            raise TypeError(f"constant_buffers holds {name!r}, not a buffer name")
        if name in params:
            raise ValueError(
                f"constant_buffers names {name!r}, a parameter: a frozen parameter goes "
                "into the frozen file by itself (requires_grad_(False)); list buffers only"
            )
        if name not in buffers:
            known = sorted(buffers & saved)
            raise ValueError(
                f"constant_buffers names {name!r}, which is no buffer of the model "
                f"(its saved buffers: {known[:8]}{' ...' if len(known) > 8 else ''})"
            )
        if name not in saved:
            raise ValueError(
                f"constant_buffers names {name!r}, a non-persistent buffer: it is not "
                "saved at all, so it cannot be carried; leave it out"
            )
    return names


def split(model: torch.nn.Module, constant: frozenset[str]) -> tuple[Tensors, Tensors]:
    """The model's state as (the rest, the frozen part), each tensor once and contiguous:
    names sharing storage (tied weights) are stored under one name, as ``save_model``
    does (the load restores the others through the sharing), the frozen part on the CPU
    (its bytes are hashed)."""
    frozen_names = constant | {
        n for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad
    }
    state = model.state_dict()
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name, tensor in state.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"the model's state {name!r} is a {type(tensor).__name__}, no tensor")
        if tensor.numel() == 0:
            groups[("empty", name)] = [name]
            continue
        storage = tensor.untyped_storage()
        groups.setdefault((tensor.device, storage.data_ptr(), storage.nbytes()), []).append(name)
    rest: Tensors = {}
    frozen: Tensors = {}
    for names in groups.values():
        complete = sorted(n for n in names if _complete(state[n]))
        kept = complete[:1] or names  # (no full view: each stored apart, as a copy)
        part = frozen if all(n in frozen_names for n in names) else rest
        for name in kept:
            tensor = state[name].detach()
            tensor = (tensor.cpu() if part is frozen else tensor).contiguous()
            part[name] = tensor.clone() if len(kept) > 1 else tensor
    return rest, frozen


def _complete(tensor: torch.Tensor) -> bool:
    storage = tensor.untyped_storage()
    return bool(
        tensor.data_ptr() == storage.data_ptr()
        and tensor.numel() * tensor.element_size() == storage.nbytes()
    )


def describe(tensors: Tensors, hashes: Mapping[str, str]) -> Described | None:
    """What the frozen file of these tensors records (None: a dtype it cannot store)."""
    names = _dtype_names()
    out: Described = {}
    for name, tensor in tensors.items():
        if tensor.dtype not in names:
            return None
        out[name] = (names[tensor.dtype], tuple(tensor.shape), hashes[name])
    return out


@functools.cache
def _dtype_names() -> dict[torch.dtype, str]:
    return {dtype: name for name, dtype in _dtypes().items()}


def recorded(path: Path) -> Described | None:
    """What the frozen file at ``path`` records (from its header only); None if it is not
    one (missing, a link, malformed, without hashes)."""
    return _recorded(path)[0]


def _recorded(path: Path) -> tuple[Described | None, tuple[int, int, int] | None]:
    """:func:`recorded`, and the (inode, size, mtime in ns) of the file its header was
    read from (None if it could not be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None, None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        raw = f.read(n) if 0 <= n <= 100 << 20 else b""
    ident = (st.st_ino, st.st_size, st.st_mtime_ns)
    try:
        header = json.loads(raw)
        hashes = json.loads(header["__metadata__"][HASHES_KEY])
        return {
            name: (str(info["dtype"]), tuple(int(d) for d in info["shape"]), str(hashes[name]))
            for name, info in header.items()
            if name != "__metadata__"
        }, ident
    except (ValueError, KeyError, TypeError):
        return None, ident


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def previous(ckpts: CheckpointDir, step: int) -> Checkpoint | None:
    """The newest complete checkpoint before ``step`` (usually one marker read)."""
    newest = ckpts.latest()
    if newest is None or newest.step < step:
        return newest
    older = [c for c in ckpts.checkpoints() if c.step < step]
    return older[-1] if older else None


def place(ckpts: CheckpointDir, commit: Commit, tensors: Tensors, hashes: dict[str, str]) -> str:
    """Put the frozen file into ``commit``: carried from the previous checkpoint when it
    records the same tensors (names, dtypes, shapes, hashes), else written; returns how
    (``"reflink"``, ``"hardlink"``, ``"copy"`` or ``"written"``), and logs it with why (the
    record's ``frozen_file`` attribute holds the same word, for a handler to count)."""
    step = commit.step
    target = commit.path / FROZEN_FILE
    new = describe(tensors, hashes)
    prev = previous(ckpts, step)
    why = "no earlier checkpoint"
    if prev is not None:
        source = prev.path / FROZEN_FILE
        old, read_from = _recorded(source)
        why = _difference(prev.step, old, new)
        if not why:
            try:
                how = commit.carry(FROZEN_FILE, from_=prev.step)
            except (VerificationError, CheckpointNotFoundError, StepConflictError, ManifestError):
                log.warning(
                    "step %d: carrying %s from step %d failed",
                    step,
                    FROZEN_FILE,
                    prev.step,
                    exc_info=True,
                )
                why = f"carrying it from step {prev.step} failed (logged above)"
            else:
                # The carried file reaches its name at the publish; the header compared is
                # the carried one if the source is still the file it was read from (a
                # change in place moves its mtime, a replacement its inode), while the
                # carry checked that file against its manifest.
                if read_from is not None and _identity(source) == read_from:
                    log.info(
                        "step %d: %s (%d tensors) carried from step %d by %s",
                        step,
                        FROZEN_FILE,
                        len(tensors),
                        prev.step,
                        how,
                        extra={"frozen_file": how},
                    )
                    return how
                # Written below: the block's file wins over the carried one at the publish.
                why = f"step {prev.step}'s {FROZEN_FILE} changed while it was carried"
    save_file(tensors, str(target), metadata={HASHES_KEY: json.dumps(hashes, sort_keys=True)})
    log.info(
        "step %d: %s (%d tensors) written: %s",
        step,
        FROZEN_FILE,
        len(tensors),
        why,
        extra={"frozen_file": "written"},
    )
    return "written"


def _difference(step: int, old: Described | None, new: Described | None) -> str:
    """Why the frozen file of ``step`` cannot be carried ("" if it can)."""
    if new is None:
        return "a frozen tensor has a dtype safetensors does not name"
    if old is None:
        return f"step {step} has no {FROZEN_FILE} with hashes"
    changed = sorted(n for n in old.keys() | new.keys() if old.get(n) != new.get(n))
    if not changed:
        return ""
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{len(changed)} tensors differ from step {step}'s ({', '.join(changed[:3])}{more})"


def frozen_of(metadata: Mapping[str, str] | None, path: Path) -> str | None:
    """The frozen file a model file's metadata names (None: it has none); ValueError for
    a name other than :data:`FROZEN_FILE` (never a path read on a file's say-so)."""
    name = (metadata or {}).get(FROZEN_KEY)
    if name is not None and name != FROZEN_FILE:
        raise ValueError(f"{path} names {name!r} as its frozen file, not {FROZEN_FILE!r}")
    return name


def metadata_of(data: memoryview) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file held in ``data`` ({} if none)."""
    n = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 <= n <= min(len(data) - 8, 100 << 20):
        raise ValueError("safetensors header length does not fit the data")
    try:
        meta = json.loads(bytes(data[8 : 8 + n])).get("__metadata__") or {}
    except (ValueError, AttributeError):
        raise ValueError("safetensors header is not a valid JSON object") from None
    if not isinstance(meta, dict):
        raise ValueError("safetensors __metadata__ is not an object")
    return {str(k): str(v) for k, v in meta.items()}


def _metadata_or_none(data: memoryview) -> dict[str, str] | None:
    try:
        return metadata_of(data)
    except ValueError:  # the model file's own load says what is wrong
        return None


def file_metadata(path: Path) -> dict[str, str]:
    """The ``__metadata__`` of the safetensors file at ``path`` (its header only)."""
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        data = head + f.read(n if n <= 100 << 20 else 0)
    return metadata_of(memoryview(data))


def merged(first: Tensors, second: Tensors, path: Path) -> Tensors:
    """The model file's tensors and the frozen file's; ValueError if both hold a name."""
    both = first.keys() & second.keys()
    if both:
        raise ValueError(f"{path}: the model file and {FROZEN_FILE} both hold {sorted(both)[:3]}")
    return {**first, **second}


def read_state(
    path: Path,
    read: Mapping[str, memoryview],
    model_name: str,
    device: str,
    *,
    require: Callable[[list[str]], None] | None = None,
) -> Tensors | None:
    """The state of a checkpoint whose model file names a frozen file: both files' tensors
    (from the verified views ``read`` if they hold the model file, else from the files);
    None if the model file names no frozen file (load it alone, as before). ``require``:
    called with ``[FROZEN_FILE]`` if ``read`` lacks it, to raise why (a verified load's)."""
    if model_name in read:
        view = read[model_name]
        if frozen_of(_metadata_or_none(view), path / model_name) is None:
            return None
        if FROZEN_FILE not in read:
            if require is not None:
                require([FROZEN_FILE])
            raise ValueError(
                f"the verified checkpoint {path} kept no verified bytes of {FROZEN_FILE}, "
                f"which its {model_name} needs: a verified load reads only what it hashed. "
                "Pass it (or STATE_FILES) to resume_verified(), or load unverified"
            )
        state = merged(_safetensors_tensors(view), _safetensors_tensors(read[FROZEN_FILE]), path)
        return {k: v.to(device) for k, v in state.items()} if device != "cpu" else state
    try:
        meta = file_metadata(path / model_name)
    except (OSError, ValueError):  # the model file's own load says what is wrong
        return None
    if frozen_of(meta, path / model_name) is None:
        return None
    if not (path / FROZEN_FILE).is_file():
        raise FileNotFoundError(
            f"{path / model_name} needs {FROZEN_FILE} beside it, and {path} has none: "
            "a checkpoint copied without all its files? Copy the whole directory"
        )
    # Mapped and read ahead, as the model file alone is (and a verified load reads both):
    # the tensors are views of the mappings, copied once, into the model.
    model_view, frozen_view = _mapped(path / model_name), _mapped(path / FROZEN_FILE)
    if model_view is None or frozen_view is None:  # cannot be mapped: read by path
        return merged(
            load_file(path / model_name, device=device),
            load_file(path / FROZEN_FILE, device=device),
            path,
        )
    state = merged(_safetensors_tensors(model_view), _safetensors_tensors(frozen_view), path)
    return {k: v.to(device) for k, v in state.items()} if device != "cpu" else state


def load_into(model: torch.nn.Module, state: Tensors, *, strict: bool) -> None:
    """``model.load_state_dict(state)`` as ``safetensors.torch.load_model`` does it: the
    model's other names for a tied tensor (stored once) are not missing."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = _tied_names(model, loaded=state.keys())
    missing = [k for k in missing if k not in tied]
    if strict and (missing or unexpected):
        raise RuntimeError(
            f"Error(s) in loading state_dict for {type(model).__name__}: "
            f"missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


def _tied_names(model: torch.nn.Module, *, loaded: Collection[str]) -> set[str]:
    """The model's state names that share storage with a name the file held."""
    by_storage: dict[tuple[torch.device, int], list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=False).items():
        if tensor.numel() == 0:
            continue
        key = (tensor.device, tensor.untyped_storage().data_ptr())
        by_storage.setdefault(key, []).append(name)
    tied: set[str] = set()
    for names in by_storage.values():
        if len(names) > 1 and any(n in loaded for n in names):
            tied.update(n for n in names if n not in loaded)
    return tied
