"""What is checked and set when a class with the Trainer mixin is defined: the order of its
bases, and the signature tools show for it."""

from __future__ import annotations

import inspect
from typing import Any


def check_bases(cls: type[Any], mixin: type[Any], trainer: type[Any]) -> None:
    """Refuse a class whose bases put ``trainer`` (``transformers.Trainer``) before ``mixin``
    (``class T(SFTTrainer, AtomicCheckpointMixin)``): every method of ``Trainer`` would
    then come first and the mixin would change nothing, silently."""
    mro = cls.__mro__
    if trainer in mro and mro.index(trainer) < mro.index(mixin):
        bases = ", ".join(b.__name__ for b in cls.__bases__ if b is not mixin)
        raise TypeError(
            f"{cls.__qualname__}: put {mixin.__name__} first in the bases "
            f"(class {cls.__name__}({mixin.__name__}, {bases})): after {trainer.__name__} "
            f"its methods are never called and no checkpoint would be atomic"
        )


def signature_of(cls: type[Any], mixin: type[Any]) -> inspect.Signature | None:
    """What ``cls(...)`` takes when its ``__init__`` is the mixin's: the parameters of the
    ``__init__`` the mixin passes them to, with the mixin's keyword options before any
    ``**kwargs``. None (inspect's own answer) when a subclass has an ``__init__`` of its own."""
    mro = cls.__mro__
    first = next((c for c in mro if "__init__" in c.__dict__), None)
    if first is not mixin:
        return None
    after = next(c for c in mro[mro.index(first) + 1 :] if "__init__" in c.__dict__)
    try:
        base = inspect.signature(after.__dict__["__init__"])
    except (TypeError, ValueError):  # a builtin __init__ without one
        return None
    params = list(base.parameters.values())[1:]  # without self
    own = inspect.signature(mixin.__init__).parameters
    ours = [p for p in own.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    at = next(
        (i for i, p in enumerate(params) if p.kind is inspect.Parameter.VAR_KEYWORD), len(params)
    )
    return base.replace(parameters=[*params[:at], *ours, *params[at:]])
