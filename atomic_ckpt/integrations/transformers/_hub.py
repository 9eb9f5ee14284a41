"""Hub pushes: Trainer's uploads, with the library's temporary entries left out."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import transformers.trainer as _trainer_module

from atomic_ckpt import TMP_INFIX
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


class _Uploads:
    """An ``HfApi`` whose ``upload_folder`` also ignores :data:`HUB_IGNORE_PATTERNS`."""

    def __init__(self, api: Any) -> None:
        self._api = api

    def __getattr__(self, name: str) -> Any:
        return getattr(self._api, name)

    def upload_folder(self, **kwargs: Any) -> Any:
        return self._api.upload_folder(**_ignoring(kwargs))


class _UploadsApi:
    """What ``transformers.trainer.hf_api`` is while a push of ours runs."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __call__(self) -> _Uploads:
        return _Uploads(self.real())


class _UploadFolder:
    """What ``transformers.trainer.upload_folder`` is (4.x) while a push of ours runs."""

    def __init__(self, real: Any) -> None:
        self.real = real

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.real(*args, **_ignoring(kwargs))


@contextlib.contextmanager
def _hub_uploads() -> Iterator[None]:
    """Trainer's Hub calls, with the library's temporary entries left out of its uploads.

    Trainer calls ``hf_api().upload_folder(...)`` (4.x: ``upload_folder(...)``) with fixed
    ignore patterns; the call itself is synchronous (an upload ``run_as_future`` gets its
    arguments here), so the swap lasts only for the push that makes it."""
    real = getattr(_trainer_module, _SEAM)
    if isinstance(real, _UploadsApi | _UploadFolder):  # already inside one
        yield
        return
    wrapper = _UploadsApi(real) if _SEAM == _HF_API else _UploadFolder(real)
    setattr(_trainer_module, _SEAM, wrapper)
    try:
        yield
    finally:
        setattr(_trainer_module, _SEAM, real)
