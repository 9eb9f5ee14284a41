"""The result type of the DCP rank runner (the ``run_dcp`` fixture in conftest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class RankResult:
    """What one rank reported (None fields if it died before reporting)."""

    rank: int
    exitcode: int | None
    error: str | None = None
    message: str = ""
    elapsed: float = 0.0
    data: Any = None

    @property
    def ok(self) -> bool:
        return self.exitcode == 0 and self.error is None


Runner = Callable[..., list[RankResult]]
