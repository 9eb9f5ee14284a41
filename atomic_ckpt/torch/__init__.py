"""Save and load a PyTorch training state inside one atomic commit.

A checkpoint made by :func:`save_state` holds:

* ``model.safetensors``: the model's parameters and buffers (safetensors;
  shared and tied tensors are stored once and restored shared);
* ``optimizer.pt`` and ``scheduler.pt``: their ``state_dict()`` with
  ``torch.save``, loaded back with ``weights_only=True`` (never arbitrary pickle);
* ``training_state.json``: the step, the epoch and any JSON user metadata;
* with ``carry_frozen=True``, ``frozen.safetensors``: the frozen parameters and the
  constant buffers, carried from the previous checkpoint when none changed
  (``docs/guides/incremental.md``).

Needs the ``torch`` extra: ``pip install 'atomic_ckpt[torch]'``.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol, SupportsIndex

import torch
from safetensors.torch import load_model, save_model

from atomic_ckpt import Checkpoint, CheckpointDir, VerifiedCheckpoint
from atomic_ckpt._core.l4_protocol.root import check_step
from atomic_ckpt.torch import _frozen, _verified
from atomic_ckpt.torch._bytes import (
    _failed,
    _load_pickle,
    _mapped,
    _safetensors_tensors,
    _unmap,
)

__all__ = [
    "FROZEN_FILE",
    "MODEL_FILE",
    "OPTIMIZER_FILE",
    "SCHEDULER_FILE",
    "STATE_FILE",
    "STATE_FILES",
    "TrainingState",
    "load_state",
    "resume",
    "save_state",
    "write_state",
]

MODEL_FILE = _frozen.MODEL_FILE
"""The model's parameters and buffers, in safetensors format (with ``carry_frozen=True``,
all but the frozen ones)."""
FROZEN_FILE = _frozen.FROZEN_FILE
"""With ``save_state(..., carry_frozen=True)``: the frozen parameters and constant buffers
(safetensors; each tensor's xxh3-128 hash in its metadata)."""
OPTIMIZER_FILE = "optimizer.pt"
"""The optimizer's ``state_dict`` (``torch.save``; loaded with ``weights_only=True``)."""
SCHEDULER_FILE = "scheduler.pt"
"""The scheduler's ``state_dict`` (``torch.save``; loaded with ``weights_only=True``)."""
STATE_FILE = "training_state.json"
"""Step, epoch and your metadata, as JSON."""
STATE_FILES = (MODEL_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, STATE_FILE, FROZEN_FILE)
"""The files :func:`save_state` writes (what a verified :func:`resume` keeps in memory)."""


class _Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


@dataclass(frozen=True)
class TrainingState:
    """What :func:`load_state` restored besides the objects it loaded into."""

    step: int
    path: Path
    epoch: int | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)


def write_state(
    directory: str | os.PathLike[str],
    *,
    step: SupportsIndex,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    epoch: int | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write a training state into ``directory`` (typically the path a commit yields).

    Each file is a new one: a name already there (a file carried from a committed
    checkpoint, which shares its storage) is unlinked first, never written through."""
    out, step = Path(directory), check_step(step)  # a bool is no step: before any write
    _unlink(out, MODEL_FILE, STATE_FILE, *_pickled(optimizer, scheduler))
    save_model(model, str(out / MODEL_FILE))
    _write_rest(
        out, step=step, optimizer=optimizer, scheduler=scheduler, epoch=epoch, metadata=metadata
    )


def _unlink(out: Path, *names: str) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out / name)


def _write_rest(
    out: Path,
    *,
    step: SupportsIndex,
    optimizer: _Stateful | None,
    scheduler: _Stateful | None,
    epoch: int | None,
    metadata: Mapping[str, Any] | None,
) -> None:
    """The files of a state besides the model's."""
    if optimizer is not None:
        torch.save(optimizer.state_dict(), out / OPTIMIZER_FILE)
    if scheduler is not None:
        torch.save(scheduler.state_dict(), out / SCHEDULER_FILE)
    doc = {"step": check_step(step), "epoch": epoch, "metadata": dict(metadata or {})}
    (out / STATE_FILE).write_text(json.dumps(doc, indent=1) + "\n")


def save_state(
    ckpts: CheckpointDir,
    step: SupportsIndex,
    *,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    epoch: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    carry_frozen: bool = False,
    constant_buffers: Collection[str] = (),
    replace_unusable: bool = False,
) -> Checkpoint:
    """Commit a training state as checkpoint ``step`` of ``ckpts``, atomically and durably.

    ``carry_frozen=True`` stores the frozen parameters (``requires_grad=False``) and the
    buffers named in ``constant_buffers`` (their ``state_dict()`` names, for buffers that
    never change: ``["rope.inv_freq"]``) in :data:`FROZEN_FILE`, with the xxh3-128 hash of
    each tensor in its metadata, and the rest in :data:`MODEL_FILE`. When the newest
    complete checkpoint before ``step`` has a frozen file recording the same tensors
    (names, dtypes, shapes and hashes), that file is carried (reflink, hard link or copy:
    see ``Commit.carry``) instead of written; how, and why not, is logged at INFO on the
    ``atomic_ckpt.torch`` logger. Every checkpoint still loads alone: :func:`load_state`
    and :func:`resume` read both files. ``constant_buffers`` without ``carry_frozen``, a
    name that is no persistent buffer of ``model``, or ``carry_frozen`` without a model
    are errors. ``replace_unusable`` as for ``CheckpointDir.commit``.
    """
    constant = _frozen.check_options(model, carry_frozen, constant_buffers)
    if carry_frozen:
        return _frozen.save(
            ckpts,
            step,  # checked by ckpts.begin (a bool is no step)
            model=model,
            constant=constant,
            metadata=metadata,
            replace_unusable=replace_unusable,
            write_rest=functools.partial(
                _write_rest,
                step=step,
                optimizer=optimizer,
                scheduler=scheduler,
                epoch=epoch,
                metadata=metadata,
            ),
        )
    with ckpts.begin(step, metadata=metadata, replace_unusable=replace_unusable) as commit:
        write_state(
            commit.path,
            step=step,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            epoch=epoch,
            metadata=metadata,
        )
    return commit.publish()  # published on leaving the block: returns its checkpoint


def load_state(
    checkpoint: Checkpoint | VerifiedCheckpoint | str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    strict: bool = True,
    device: str = "cpu",
) -> TrainingState:
    """Load a state written by :func:`save_state` into ``model`` (and optimizer, scheduler).

    Pickled state is loaded with ``weights_only=True``, on a second thread while the
    model file is read (mapped and read ahead, the model's tensors copied once, as a
    verified load reads it: an unverified load is never the slower one). Raises
    FileNotFoundError if the checkpoint lacks a file for an object you passed. Given a
    :class:`~atomic_ckpt.VerifiedCheckpoint` (from ``CheckpointDir.resume_verified``
    with :data:`STATE_FILES`), every file is loaded from the mapping it was hashed
    through, never by its path (which may hold another save by now) nor through a
    symlink; the pickles and the JSON from a copy hashed again (``docs/guides/
    guarantees.md``). A file the load needs that it did not keep is a ValueError naming
    it; a symlink in its place (or a legacy marker) a VerificationError.
    """
    names = _pickled(optimizer, scheduler)
    if isinstance(checkpoint, VerifiedCheckpoint):
        _verified.require(checkpoint, [MODEL_FILE, STATE_FILE, *names])
        path, verified = checkpoint.checkpoint.path, checkpoint
        pickles = _Pickles(path, names, device, verified=checkpoint)
    else:
        path = checkpoint.path if isinstance(checkpoint, Checkpoint) else Path(checkpoint)
        verified = None
        pickles = _Pickles(path, names, device)
    with pickles:
        return _load(
            path,
            verified,
            pickles,
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            strict=strict,
            device=device,
        )


def resume(
    ckpts: CheckpointDir,
    *,
    model: torch.nn.Module,
    optimizer: _Stateful | None = None,
    scheduler: _Stateful | None = None,
    verify: bool = False,
    device: str = "cpu",
    fresh: bool = False,
) -> TrainingState | None:
    """Load the latest complete checkpoint of ``ckpts``; None if there is none.

    A root holding step directories without a marker and no complete checkpoint
    raises :class:`~atomic_ckpt.UnmarkedCheckpointsError` rather than start from
    scratch over them, unless ``fresh=True`` (see ``CheckpointDir.resume_point``).

    With ``verify=True`` every file is checked against the manifest (sizes and
    checksums) and the state is loaded from the very bytes that were hashed, so
    each byte is read from storage once; the pickles are deserialized while the
    rest is hashed, and nothing is loaded into ``model`` or the optimizer before the
    whole checkpoint verified (``benchmarks/resume.py`` measures what it costs). A
    newest checkpoint that does not verify is skipped with a warning, and the newest
    one that does is loaded (as ``atomic_ckpt.distributed.resume`` does).
    """
    if not verify:
        found = ckpts.resume_point(fresh=fresh)
        if found is None:
            return None
        return load_state(
            found, model=model, optimizer=optimizer, scheduler=scheduler, device=device
        )
    guess = ckpts.resume_point(fresh=fresh)  # the newest: verified next, likely the one
    if guess is None:
        return None
    names = _pickled(optimizer, scheduler)
    algorithm = guess.manifest.checksum
    with _Pickles(guess.path, names, device, early=True, algorithm=algorithm) as early:
        verified = ckpts.resume_verified(STATE_FILES, fresh=fresh)
        if verified is None:
            return None
        _verified.require(verified, [MODEL_FILE, STATE_FILE, *names])
        path = verified.checkpoint.path
        if early.read_what(verified):  # the bytes deserialized early are the ones hashed
            return _load(
                path,
                verified,
                early,
                model=model,
                optimizer=optimizer,
                scheduler=scheduler,
                strict=True,
                device=device,
            )
    return load_state(
        verified, model=model, optimizer=optimizer, scheduler=scheduler, device=device
    )


def _pickled(optimizer: _Stateful | None, scheduler: _Stateful | None) -> list[str]:
    """The ``torch.save`` files a load of these objects needs."""
    return [n for n, o in ((OPTIMIZER_FILE, optimizer), (SCHEDULER_FILE, scheduler)) if o]


def _load(
    path: Path,
    verified: VerifiedCheckpoint | None,
    pickles: _Pickles,
    *,
    model: torch.nn.Module,
    optimizer: _Stateful | None,
    scheduler: _Stateful | None,
    strict: bool,
    device: str,
) -> TrainingState:
    """Load into the objects: the model from the verified views (else its file, mapped), the
    rest from ``pickles`` and the JSON from a checked copy (else its file); verified,
    nothing is loaded before the pickles' and the JSON's bytes are found to be hashed."""
    if verified is not None:
        read = verified.files
        raw = _verified.copy(verified, STATE_FILE)
        pickles.checked()
        require = functools.partial(_verified.require, verified)
        both = _frozen.read_state(path, read, MODEL_FILE, device, require=require)
    else:
        read, raw = {}, (path / STATE_FILE).read_bytes()
        both = _frozen.read_state(path, read, MODEL_FILE, device)
    if both is not None:
        _frozen.load_into(model, both, strict=strict)
    elif MODEL_FILE in read:
        _load_model_bytes(model, read[MODEL_FILE], strict=strict, device=device)
    elif (view := _mapped(path / MODEL_FILE)) is not None:
        try:  # unverified: the same mapping and read-ahead as a verified load
            _load_model_bytes(model, view, strict=strict, device=device)
        finally:
            _unmap(view)
    else:
        load_model(model, str(path / MODEL_FILE), strict=strict, device=device)
    if optimizer is not None:
        optimizer.load_state_dict(pickles.result(OPTIMIZER_FILE))
    if scheduler is not None:
        scheduler.load_state_dict(pickles.result(SCHEDULER_FILE))
    doc = json.loads(raw)
    return TrainingState(
        step=int(doc["step"]),
        path=path,
        epoch=doc.get("epoch"),
        metadata=doc.get("metadata") or {},
    )


class _Pickles:
    """``torch.save`` files of one checkpoint, deserialized on a thread
    (``weights_only=True``), so that their reading overlaps the model's (and a verify's).

    Unverified, each file is opened at once and read by the thread. ``verified``: each
    one's bytes are copied out of its hashed view and checked again (``_verified.copy``).
    ``early`` (before a verify checksumming with ``algorithm``): each is read whole (never
    through a link) and hashed; :meth:`read_what` then tells, by the digests, whether the
    bytes deserialized are the ones the verify hashed. Leaving the block waits for the
    thread (a result nobody asked for is dropped, its error too).
    """

    def __init__(
        self,
        directory: Path,
        names: Collection[str],
        device: str,
        *,
        verified: VerifiedCheckpoint | None = None,
        early: bool = False,
        algorithm: str | None = None,
    ) -> None:
        self._files: dict[str, BinaryIO] = {}
        self._digests: dict[str, Future[_verified.Digest]] = {}
        self._futures: dict[str, Future[dict[str, Any]]] = {}
        self._directory = directory
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="atomic_ckpt-load")
        for name in names:
            if verified is not None or early:
                digest: Future[_verified.Digest] = Future()
                self._digests[name] = digest
                read = (
                    functools.partial(_verified.read_file, directory / name, algorithm)
                    if verified is None
                    else functools.partial(_verified.copied, verified, name)
                )
                task = functools.partial(_read_then_load, read, digest, directory / name, device)
                self._futures[name] = self._pool.submit(task)
                continue
            try:
                # Never through a symlink: a verify maps regular files only.
                fd = os.open(directory / name, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            except OSError as exc:
                self._futures[name] = _failed(exc)
                continue
            f = self._files[name] = os.fdopen(fd, "rb")
            self._futures[name] = self._pool.submit(_load_pickle, f, directory / name, device)

    def result(self, name: str) -> dict[str, Any]:
        """The state dict of ``name``; its error (FileNotFoundError for a missing file)."""
        return self._futures[name].result()

    def checked(self) -> None:
        """Wait until every file's bytes were read (and, verified, checked): their error."""
        for digest in self._digests.values():
            digest.result()

    def read_what(self, verified: VerifiedCheckpoint) -> bool:
        """Whether the files read early are, by their size and checksum, the ones the
        manifest of ``verified`` records (so the bytes deserialized are verified bytes)."""
        if verified.checkpoint.path != self._directory:
            return False
        for name, digest in self._digests.items():
            if digest.exception() is not None or digest.result()[2] is None:
                return False  # (no checksum to compare: the views' copies are loaded)
            if not _verified.matches(verified, name, digest.result()):
                return False
        return True

    def __enter__(self) -> _Pickles:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for f in self._files.values():
            f.close()


def _read_then_load(
    read: Callable[[], tuple[bytes, _verified.Digest]],
    digest: Future[_verified.Digest],
    path: Path,
    device: str,
) -> dict[str, Any]:
    """A pickle's bytes read (``digest`` set, or its error), then deserialized from them."""
    try:
        data, found = read()
    except BaseException as exc:
        digest.set_exception(exc)
        raise
    digest.set_result(found)
    return _load_pickle(io.BytesIO(data), path, device)


def _load_model_bytes(
    model: torch.nn.Module, data: memoryview, *, strict: bool, device: str
) -> None:
    """``safetensors.torch.load_model`` from bytes in memory: the same handling of tied
    tensors (stored once; the model's other names for them are not missing)."""
    state = _safetensors_tensors(data)
    if device != "cpu":
        state = {k: v.to(device) for k, v in state.items()}
    _frozen.load_into(model, state, strict=strict)
