"""What a background worker (AsyncCommitter, Mirror) does at the end of a ``with`` block."""

from __future__ import annotations

from types import TracebackType
from typing import ClassVar, Self


class ClosesOnExit:
    """A context manager whose exit is ``close()``: it waits for the work in flight and
    raises its error. If the block itself failed, the block's error is the one raised,
    and close's is attached to it as a note rather than hiding it."""

    _closing_what: ClassVar[str] = "the background work"
    """What failed, in the note attached to the block's error."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        try:
            self.close()
        except BaseException as failed:
            exc.add_note(f"atomic_ckpt: {self._closing_what} failed as well: {failed!r}")
