"""The ``atomic-ckpt verify`` command: each step's (and named checkpoint's) verdict, one
deleted or replaced by a live run meanwhile told apart from a failure, and a progress bar
on a terminal.

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

from atomic_ckpt import CheckpointDir, CheckpointNotFoundError, VerificationError, parse_step
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
    """``atomic-ckpt verify ROOT [STEP|NAME]``: the one checkpoint given (a step, as ``ls``
    shows it, or a named checkpoint's name), else every complete step and then every
    complete named checkpoint (a carry source shares its files with its carriers, so a
    named one is checked as a step is)."""
    if is_url(args.root):
        return _verify_remote(args)
    ckpts = open_local(args)
    listed = args.target is None
    targets: list[int | str]
    if listed:
        targets = [*ckpts.steps(), *(n.name for n in ckpts.named())]
    else:
        step = _step(args.target, ckpts.prefix)
        targets = [args.target if step is None else step]
    if not targets:
        raise Failure(f"no complete checkpoint in {ckpts.root}", EXIT_NONE)
    show = not args.json and sys.stderr.isatty()
    results: list[dict[str, Any]] = []
    for target in targets:
        bar = _ProgressBar(_label(target), sys.stderr) if show else None
        try:
            results.append(_verify_one(ckpts, target, listed=listed, progress=bar))
        finally:
            if bar is not None:
                bar.close()
    return _report(results, as_json=args.json)


def _step(text: str, prefix: str) -> int | None:
    """The step ``text`` names as ``ls`` shows it (``5``, or ``checkpoint-5`` with that
    prefix), or None: a named checkpoint's name."""
    step = parse_step(text, prefix)
    return step if step is not None or not prefix else parse_step(text)


def _label(target: int | str) -> str:
    return f"step {target}" if isinstance(target, int) else f"named {target}"


def _verify_remote(args: argparse.Namespace) -> int:
    remote = open_remote(args)
    step = None if args.target is None else _step(args.target, args.prefix)
    if args.target is not None and step is None:
        raise Failure(f"verify on a URL root takes a step, not {args.target!r}")
    steps = [step] if step is not None else remote.steps()
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
    """The lines ``verify`` prints for one checkpoint's result (a step's, or a named one's:
    ``named base: ok``)."""
    what = f"step {r['step']}" if r.get("name") is None else f"named {r['name']}"
    if r.get("gone"):
        return [f"{what}: gone (deleted during the run)"]
    if r["ok"]:
        note = " (legacy marker: presence only)" if r.get("legacy") else ""
        return [f"{what}: ok{note}"]
    problems = r.get("problems") or []
    if not problems:
        return [f"{what}: FAILED: {r['error']}"]
    count = f"{len(problems)} problem" + ("s" if len(problems) > 1 else "")
    return [f"{what}: FAILED ({count})", *(f"  {p}" for p in problems)]


def _verify_one(
    ckpts: CheckpointDir,
    target: int | str,
    *,
    listed: bool,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Verify one step (or named checkpoint: ``target`` a str; its result has its
    ``name``, and ``step`` None). One listed a moment ago that a live run deleted (or
    replaced) meanwhile is reported as gone (or verified again), never as FAILED."""
    key: dict[str, Any] = (
        {"step": target} if isinstance(target, int) else {"step": None, "name": target}
    )
    where = ckpts.path_of(target) if isinstance(target, int) else ckpts.root / target
    for attempt in (1, 2):
        try:
            ckpt = ckpts.verify(target, progress=progress)
            return {**key, "ok": True, "legacy": ckpt.manifest.legacy, "path": str(ckpt.path)}
        except (CheckpointNotFoundError, VerificationError) as exc:
            failure = exc
        if listed and not os.path.lexists(where):
            return {**key, "ok": True, "gone": True}
        if not (listed and attempt == 1 and isinstance(failure, VerificationError)):
            break
    result: dict[str, Any] = {**key, "ok": False, "error": str(failure)}
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
