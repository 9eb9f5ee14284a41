"""Public names report the path users import them from, not the private module that defines them.

Tracebacks, reprs, pickles and the API docs then say ``atomic_ckpt.CheckpointDir`` (or
``atomic_ckpt.remote.Mirror``), a path that stays put when the private layout changes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, MutableMapping
from typing import Any


def export(module: str, namespace: MutableMapping[str, Any], names: Iterable[str]) -> None:
    """Set ``__module__`` to ``module`` on every class and function among ``names`` in
    ``namespace`` that a private module below ``atomic_ckpt`` defines."""
    for name in names:
        obj = namespace[name]
        if not (isinstance(obj, type) or callable(obj)):
            continue
        defined = getattr(obj, "__module__", None)
        if isinstance(defined, str) and defined.startswith("atomic_ckpt.") and "._" in defined:
            with contextlib.suppress(AttributeError, TypeError):  # builtins: leave them
                obj.__module__ = module
