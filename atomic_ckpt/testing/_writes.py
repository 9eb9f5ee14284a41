"""A traced data operation's writes, replayed on whatever its file holds in a crash state:
the run kept, zero-filled or torn half-way as one, or each of its writes its own fate.

A recorded data operation of the library's hooks is the file's contents afterwards (a
snapshot). One of the audit's stands for a run of write calls, and a snapshot would
credit it with every earlier write of the file: kept after an earlier operation was lost,
it would bring the lost bytes back (a header written last would carry the body it follows).
So the audit's operations also keep their writes (:data:`Write`), and a crash state
applies them to the file as that state has it; each separate write (a seek or an overlap
starts a new one, contiguous writes are one) may have its own fate, as the page cache
writes blocks back in any order."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

from atomic_ckpt.testing._sparse import Buffer, Data, cut, freeze, put, read, thaw, zero, zeros

Write: TypeAlias = tuple[str, int, int, "bytes | None"]
"""(kind, offset, length, payload): ``write`` (payload None: the bytes the operation's
final contents hold there, no later write of the run covering them), ``zero`` (a punched
or zeroed range), ``truncate`` (to ``offset`` bytes)."""

WriteFates: TypeAlias = tuple[str, ...]
"""One fate per write of an operation: ``kept``, ``lost``, ``zero`` (its range zero-filled,
the file extended as far as it reached), ``torn`` (the first half of its bytes)."""


def coalesce(events: Sequence[tuple[str, int, bytes, int]]) -> tuple[Write, ...]:
    """The run's events ((write, offset, payload, 0), (zero, offset, b"", length),
    (truncate, length, b"", 0)) as separate writes: one that starts where the previous
    one ended joins it. A write's payload is kept only if a later one overlaps it."""
    spans: list[tuple[str, int, int, list[bytes]]] = []
    for kind, offset, payload, length in events:
        size = len(payload) if kind == "write" else length
        if spans and kind == spans[-1][0] != "truncate" and offset == sum(spans[-1][1:3]):
            k, o, n, pieces = spans[-1]
            pieces.append(payload)
            spans[-1] = (k, o, n + size, pieces)
        else:
            spans.append((kind, offset, size, [payload]))
    out: list[Write] = []
    for i, (kind, offset, length, pieces) in enumerate(spans):
        end = offset + length
        covered = any(
            o < end and offset < o + n for k, o, n, _ in spans[i + 1 :] if k != "truncate"
        )
        out.append(
            (kind, offset, length, b"".join(pieces) if kind == "write" and covered else None)
        )
    return tuple(out)


def _bytes(w: Write, final: Data) -> bytes:
    return w[3] if w[3] is not None else read(final, w[1], w[2])


def _apply(buf: Buffer, w: Write, final: Data, length: int | None = None) -> Buffer:
    kind, offset, size, _ = w
    if kind == "truncate":
        return cut(buf, offset)
    n = size if length is None else length
    if kind == "zero":
        return zero(buf, offset, n)
    return put(buf, offset, _bytes(w, final)[:n])


def replay(base: Data, writes: Sequence[Write], final: Data, fate: str | WriteFates) -> Data:
    """``writes`` (an operation whose contents afterwards were ``final``) applied to
    ``base``: ``kept``, ``zero`` (kept, then every byte zero at that length), ``torn``
    (until half the bytes written), or one fate per write (:data:`WriteFates`)."""
    buf = thaw(base)
    if isinstance(fate, tuple):
        for w, f in zip(writes, fate, strict=True):
            if w[0] == "truncate" or f == "kept":
                buf = _apply(buf, w, final)
            elif f == "zero":
                buf = zero(buf, w[1], w[2])
            elif f == "torn":
                buf = _apply(buf, w, final, w[2] // 2)
        return freeze(buf)
    if fate == "torn":
        half = sum(w[2] for w in writes if w[0] != "truncate") // 2
        done = 0
        for w in writes:
            if w[0] == "truncate":
                buf = _apply(buf, w, final)
                continue
            take = min(w[2], half - done)
            buf = _apply(buf, w, final, take)
            done += take
            if done >= half:
                break
        return freeze(buf)
    for w in writes:
        buf = _apply(buf, w, final)
    return zeros(len(buf)) if fate == "zero" else freeze(buf)
