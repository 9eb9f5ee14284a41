"""Integrations with training frameworks, one module per framework, each behind its own extra.

Each integration states the framework versions it is tested with (its ``TESTED_RANGE``, a
:class:`TestedRange`) and,
imported next to a version outside them, warns with :class:`UntestedVersionWarning`.
"""

from atomic_ckpt.integrations._versions import TestedRange, UntestedVersionWarning

__all__ = ["TestedRange", "UntestedVersionWarning"]
