"""The ``atomic-ckpt verify`` command: each step's verdict, a step deleted or replaced
by a live run meanwhile told apart from a failure, and a progress bar on a terminal.

(Private: used by :mod:`atomic_ckpt.cli`.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError, VerificationError
from atomic_ckpt.cli.common import (
    EXIT_NONE,
    EXIT_OK,
    Failure,
    human,
    is_url,
    open_local,
    open_remote,
)


def verify(args: argparse.Namespace) -> int:
    if is_url(args.root):
        return _verify_remote(args)
    ckpts = open_local(args)
    listed = args.step is None
    steps = [args.step] if args.step is not None else ckpts.steps()
    if not steps:
        raise Failure(f"no complete checkpoint in {ckpts.root}", EXIT_NONE)
    show = not args.json and sys.stderr.isatty()
    results: list[dict[str, Any]] = []
    for step in steps:
        bar = _ProgressBar(f"step {step}", sys.stderr) if show else None
        try:
            results.append(_verify_one(ckpts, step, listed=listed, progress=bar))
        finally:
            if bar is not None:
                bar.close()
    return _report(results, as_json=args.json)


def _verify_remote(args: argparse.Namespace) -> int:
    remote = open_remote(args)
    steps = [args.step] if args.step is not None else remote.steps()
    if not steps:
        raise Failure(f"no complete checkpoint in {remote.url}", EXIT_NONE)
    results: list[dict[str, Any]] = []
    for step in steps:
        try:
            ckpt = remote.verify(step)
            results.append({"step": step, "ok": True, "legacy": False, "path": ckpt.url})
        except (CheckpointNotFoundError, VerificationError) as exc:
            result: dict[str, Any] = {"step": step, "ok": False, "error": str(exc)}
            if isinstance(exc, VerificationError):
                result["problems"] = list(exc.problems)
            results.append(result)
    return _report(results, as_json=args.json)


def _report(results: list[dict[str, Any]], *, as_json: bool) -> int:
    """Print each step's verdict (a failed one's problems under it, one per line) or the
    JSON list; the exit status: 0 if every step is ok, else 1."""
    if as_json:
        print(json.dumps(results, indent=1))
    else:
        for r in results:
            for line in verdict(r):
                print(line)
    return EXIT_OK if all(r["ok"] for r in results) else EXIT_NONE


def verdict(r: dict[str, Any]) -> list[str]:
    """The lines ``verify`` prints for one step's result."""
    if r.get("gone"):
        return [f"step {r['step']}: gone (deleted during the run)"]
    if r["ok"]:
        note = " (legacy marker: presence only)" if r.get("legacy") else ""
        return [f"step {r['step']}: ok{note}"]
    problems = r.get("problems") or []
    if not problems:
        return [f"step {r['step']}: FAILED: {r['error']}"]
    count = f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")
    return [f"step {r['step']}: FAILED ({count})", *(f"  {p}" for p in problems)]


def _verify_one(
    ckpts: CheckpointDir,
    step: int,
    *,
    listed: bool,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Verify one step. A step listed a moment ago that a live run deleted (or replaced)
    meanwhile is reported as gone (or verified again), never as FAILED."""
    for attempt in (1, 2):
        try:
            ckpt = ckpts.verify(step, progress=progress)
            return {
                "step": step,
                "ok": True,
                "legacy": ckpt.manifest.legacy,
                "path": str(ckpt.path),
            }
        except (CheckpointNotFoundError, VerificationError) as exc:
            failure = exc
        if listed and not os.path.lexists(ckpts.path_of(step)):
            return {"step": step, "ok": True, "gone": True}
        if not (listed and attempt == 1 and isinstance(failure, VerificationError)):
            break
    result: dict[str, Any] = {"step": step, "ok": False, "error": str(failure)}
    if isinstance(failure, VerificationError):
        result["problems"] = list(failure.problems)
    return result


class _ProgressBar:
    """One self-overwriting line on a terminal: a bar, bytes done of total, rate and ETA.

    Called as a verify progress callback; ``close()`` erases the line, so what
    follows (the verdict, on stdout) starts on a clean one. The line fits the
    terminal's width (a wrapped line could not be overwritten).
    """

    WIDTH = 24

    def __init__(self, label: str, stream: TextIO) -> None:
        self._label = label
        self._stream = stream
        self._start = time.monotonic()
        self._shown = 0
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # not a real terminal (tests)
            columns = 0
        self._columns = columns if columns > 0 else 80  # a pty may report 0: unknown

    def __call__(self, done: int, total: int) -> None:
        elapsed = time.monotonic() - self._start
        fraction = done / total if total else 1.0
        rate = done / elapsed if elapsed > 0 else 0.0
        if done >= total:
            eta = "done"
        elif rate > 0:
            eta = "ETA " + _clock((total - done) / rate)
        else:
            eta = "ETA --:--"
        head = f"{self._label}: "
        tail = f" {fraction:4.0%} {human(done)} / {human(total)}  {human(int(rate))}/s  {eta}"
        width = min(self.WIDTH, self._columns - 1 - len(head) - len(tail) - 2)
        filled = int(width * fraction)
        bar = f"[{'#' * filled}{'-' * (width - filled)}]" if width >= 5 else ""
        line = (head + bar + tail)[: max(self._columns - 1, 1)]
        self._stream.write("\r" + line.ljust(self._shown))
        self._stream.flush()
        self._shown = len(line)

    def close(self) -> None:
        if self._shown:
            self._stream.write("\r" + " " * self._shown + "\r")
            self._stream.flush()
            self._shown = 0


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds + 0.5), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
