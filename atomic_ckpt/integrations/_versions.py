"""The one version check every integration runs when it is imported.

Each integration module names, in one place, the framework versions CI tests it with (a
:class:`TestedRange`: the oldest and the newest, both run by ``.ci/run``) and the private
framework methods it overrides or reads, then calls :func:`warn_if_untested` at import.
A version outside the range still imports, with an :class:`UntestedVersionWarning` that
names the range and those methods (what a new release is most likely to have changed):
refusing would lock out users of a framework release that works, and the extras carry
no upper bound. A private method that is known to be missing or to have changed its
parameters is a different matter: the integration refuses that at import, itself.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

# packaging is imported where it is used: it comes with the frameworks, not with the core, and
# ``import atomic_ckpt.integrations`` (which names UntestedVersionWarning) must not need it.

__all__ = ["TestedRange", "UntestedVersionWarning", "warn_if_untested"]


class UntestedVersionWarning(UserWarning):
    """An integration was imported next to a framework version outside its tested range.

    It may well work; if it does not, install a version in the range the message names.
    Silence it with ``warnings.filterwarnings("ignore", category=UntestedVersionWarning)``.
    """


@dataclass(frozen=True)
class TestedRange:
    """The versions of ``package`` an integration is tested with: ``oldest`` and
    ``newest`` are the releases CI installs and runs the integration's tests against.

    A version is in the range from ``oldest`` up to any patch release of ``newest``'s
    minor series (``5.24.0`` covers ``5.24.3``; ``5.25.0`` is outside), pre-releases of
    ``oldest`` excluded.
    """

    package: str
    oldest: str
    newest: str

    def __contains__(self, version: object) -> bool:
        from packaging.version import Version

        v = Version(str(version))
        newest = Version(self.newest)
        return Version(self.oldest) <= v and v.release[:2] <= newest.release[:2]

    def __str__(self) -> str:
        from packaging.version import Version

        major, minor = Version(self.newest).release[:2]
        return f"{self.package} {self.oldest} to {major}.{minor}.x"


def warn_if_untested(
    module: str, tested: TestedRange, version: str, private: Sequence[str] = ()
) -> bool:
    """Warn (:class:`UntestedVersionWarning`) if ``version`` of ``tested.package`` is
    outside ``tested``; ``module`` is the integration, ``private`` the framework methods
    it overrides or reads. Returns whether it warned."""
    if version in tested:
        return False
    seams = (
        f": it overrides or reads {', '.join(private)}, which may have changed" if private else ""
    )
    warnings.warn(
        UntestedVersionWarning(
            f"{module} is tested with {tested}, and {tested.package} {version} is installed"
            f"{seams}. It is imported anyway; if it misbehaves, install a tested version "
            f"(pip install '{tested.package}>={tested.oldest},<={tested.newest}') and "
            f"report it"
        ),
        stacklevel=2,
    )
    return True


# Their public home (tracebacks, pickles and the API reference say atomic_ckpt.integrations).
UntestedVersionWarning.__module__ = TestedRange.__module__ = "atomic_ckpt.integrations"
