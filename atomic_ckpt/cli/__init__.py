"""The ``atomic-ckpt`` command line: :func:`main`, one module per command, the demos."""

from atomic_ckpt.cli.main import main

__all__ = ["main"]
