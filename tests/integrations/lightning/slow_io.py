"""Helpers of the asynchronous-save tests: a slow disk, and calls made as a checkpoint
callback makes them."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch


class SlowWriter:
    """``torch.save`` off the main thread waits until :attr:`gate` opens (a slow disk)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.held = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        real = torch.save

        def save(*args: Any, **kwargs: Any) -> None:
            if threading.current_thread() is not threading.main_thread():
                self.held += 1
                assert self.gate.wait(30), "the gate never opened"
            real(*args, **kwargs)

        monkeypatch.setattr(torch, "save", save)


class Caller:
    """What a checkpoint callback asks the plugin for (queued with ``async_save=True``):
    the calls are made from a method of a Lightning ``Checkpoint``, as ``ModelCheckpoint``
    makes them; anything else is a call by hand, done before it returns."""

    def __init__(self, io: Any) -> None:
        from lightning.pytorch.callbacks import Checkpoint

        class Callback(Checkpoint):  # type: ignore[misc]
            def ask(self, method: str, *args: Any) -> None:
                getattr(io, method)(*args)

        self._callback = Callback()
        self.io = io

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any) -> None:
        self._callback.ask("save_checkpoint", checkpoint, path)

    def remove_checkpoint(self, path: Any) -> None:
        self._callback.ask("remove_checkpoint", path)

    def link(self, filepath: Any, linkpath: Any) -> None:
        self._callback.ask("link", filepath, linkpath)

    def __getattr__(self, name: str) -> Any:  # wait, teardown, load_checkpoint: the plugin's
        return getattr(self.io, name)
