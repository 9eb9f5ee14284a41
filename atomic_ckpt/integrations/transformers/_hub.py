"""Hub pushes: Trainer's uploads, with the library's temporary entries left out."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import transformers.trainer as _trainer_module

from atomic_ckpt import TMP_INFIX, CheckpointDir
from atomic_ckpt.integrations.transformers._compat import _HF_API, _SEAM

HUB_IGNORE_PATTERNS = (f"*{TMP_INFIX}*",)
"""Added to the ``ignore_patterns`` of every upload Trainer makes (beside its own ``_*`` and
``checkpoint-*``): the library's staging, aside and lock entries, which are never part of a
checkpoint (their names, and only theirs, contain ``.tmp-``; a plain Trainer's output
directory holds none). ``*`` matches across ``/``, so nothing inside them goes either."""


def _ignoring(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``upload_folder`` keyword arguments that also ignore :data:`HUB_IGNORE_PATTERNS`."""
    ignore = kwargs.get("ignore_patterns")
    ignore = [] if ignore is None else [ignore] if isinstance(ignore, str) else list(ignore)
    return {**kwargs, "ignore_patterns": [*ignore, *HUB_IGNORE_PATTERNS]}


class _Uploading:
    """The background uploads (``run_as_future``) Trainer started, with the folder each reads:
    rotation keeps a checkpoint an upload still reads until that upload ends (issue 30
    item 24; ``hub_strategy="checkpoint"`` and ``"all_checkpoints"`` upload ``checkpoint-N``
    itself, on HfApi's thread, while training goes on and rotates)."""

    def __init__(self) -> None:
        self._jobs: list[tuple[Path, Future[Any]]] = []
        self._lock = threading.Lock()

    def add(self, folder: Any, job: Any) -> None:
        if folder is not None and isinstance(job, Future) and not job.done():
            with self._lock:
                self._jobs.append((Path(os.path.realpath(os.fspath(folder))), job))

    def steps(self, ckpts: CheckpointDir) -> set[int]:
        """The steps of ``ckpts`` whose directory an unfinished upload reads."""
        with self._lock:
            self._jobs = [(f, j) for f, j in self._jobs if not j.done()]
            folders = [f for f, _ in self._jobs]
        return {s for s in ckpts.steps() if Path(os.path.realpath(ckpts.path_of(s))) in folders}


class _Uploads:
    """An ``HfApi`` whose ``upload_folder`` also ignores :data:`HUB_IGNORE_PATTERNS` (and
    notes each background upload in ``uploading``)."""

    def __init__(self, api: Any, uploading: _Uploading | None) -> None:
        self._api = api
        self._uploading = uploading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def upload_folder(self, **kwargs: Any) -> Any:
        job = self._api.upload_folder(**_ignoring(kwargs))
        if self._uploading is not None:
            self._uploading.add(kwargs.get("folder_path"), job)
        return job


class _UploadsApi:
    """What ``transformers.trainer.hf_api`` is while a push of ours runs."""

    def __init__(self, real: Any, uploading: _Uploading | None = None) -> None:
        self.real = real
        self.uploading = uploading

    def __call__(self) -> _Uploads:
        return _Uploads(self.real(), self.uploading)


class _UploadFolder:
    """What ``transformers.trainer.upload_folder`` is (4.x) while a push of ours runs."""

    def __init__(self, real: Any, uploading: _Uploading | None = None) -> None:
        self.real = real
        self.uploading = uploading

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        job = self.real(*args, **_ignoring(kwargs))
        if self.uploading is not None:
            self.uploading.add(kwargs.get("folder_path"), job)
        return job


@contextlib.contextmanager
def _hub_uploads(uploading: _Uploading | None = None) -> Iterator[None]:
    """Trainer's Hub calls, with the library's temporary entries left out of its uploads.

    Trainer calls ``hf_api().upload_folder(...)`` (4.x: ``upload_folder(...)``) with fixed
    ignore patterns; the call itself is synchronous (an upload ``run_as_future`` gets its
    arguments here), so the swap lasts only for the push that makes it. The background
    uploads it starts are noted in ``uploading``."""
    real = getattr(_trainer_module, _SEAM)
    if isinstance(real, _UploadsApi | _UploadFolder):  # already inside one
        yield
        return
    wrapper = _UploadsApi(real, uploading) if _SEAM == _HF_API else _UploadFolder(real, uploading)
    setattr(_trainer_module, _SEAM, wrapper)
    try:
        yield
    finally:
        setattr(_trainer_module, _SEAM, real)
