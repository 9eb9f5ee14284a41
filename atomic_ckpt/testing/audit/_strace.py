"""Run a command under ``strace`` and read its trace back as completed system calls.

The trace is one file for every process and thread (``-f``), with file descriptors
decorated with their paths (``-yy``), flags as raw numbers (``-X raw``), no strings
(``-s 0``) but a hex dump of every byte written (``-e write=all``). A call split by
another thread's (``<unfinished ...>`` / ``<... resumed>``) is yielded when it
completes: the order in which calls took effect.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from atomic_ckpt.testing.audit._errors import AuditError
from atomic_ckpt.testing.audit._procs import run_traced
from atomic_ckpt.testing.audit._syscalls import STRACE_TRACE

AT_FDCWD = -100

# Every call in the allow-list (:mod:`._syscalls`); nothing else is traced (seccomp-bpf
# lets the rest run at full speed).

INSTALL_HINT = (
    "strace is needed to record the workload's file operations and was not found on PATH; "
    "install it (Debian/Ubuntu: `apt-get install strace`, Fedora: `dnf install strace`) "
    "and run the audit again"
)


class StraceNotFound(AuditError, FileNotFoundError):
    """``strace`` is not installed."""


def strace_path() -> str:
    """The ``strace`` executable, or :class:`StraceNotFound` saying how to install it."""
    found = shutil.which("strace")
    if found is None:
        raise StraceNotFound(INSTALL_HINT)
    return found


def record_command(
    argv: Sequence[str],
    trace: Path,
    *,
    cwd: str | None = None,
    env: Mapping[str, str] | None = None,
    output: Path | None = None,
    timeout: float | None = None,
) -> int:
    """Run ``argv`` under strace writing ``trace``; return the workload's exit status.

    The workload's stdout and stderr go to ``output`` (default: inherited). Past
    ``timeout`` seconds, or on any exception while waiting, the whole traced tree is
    ended (:func:`._procs.run_traced`).
    """
    cmd = [
        strace_path(),
        "-f",
        "-qq",
        "-yy",
        "-X",
        "raw",
        "-s",
        "0",
        "--seccomp-bpf",
        "-e",
        "signal=none",
        "-e",
        "abbrev=!recvmsg,recvmmsg",  # the descriptors an SCM_RIGHTS message carries
        "-e",
        "write=all",
        "-e",
        f"trace={STRACE_TRACE}",
        "-o",
        str(trace),
        "--",
        *argv,
    ]
    if output is None:
        return run_traced(cmd, cwd=cwd, env=env, stdout=None, timeout=timeout)
    with open(output, "wb") as out:
        return run_traced(cmd, cwd=cwd, env=env, stdout=out, timeout=timeout)


@dataclass
class Call:
    """One completed system call."""

    tid: int
    name: str
    args: list[str]
    ret: int | None
    """The return value; None for a failed call (``-1 ERRNO``) or one never finished."""
    ret_path: str | None = None
    """The path strace decorated the returned descriptor with (``open`` and friends)."""
    data: bytearray = field(default_factory=bytearray)
    """The bytes written (``write``, ``pwrite64``, ``writev``...), from the hex dump."""
    line: int = 0
    """The trace line the call completed on."""
    start: int = 0
    """The trace line it began on (earlier than ``line`` when another thread's call was
    printed in between: the two ran at the same time)."""
    former: int | None = None
    """For an execve made by a thread other than its process's leader: that thread's id
    (the kernel gives it the leader's, ``tid``, and ends every other thread)."""
    unfinished: bool = False
    """It never returned (``= ?``, or left unfinished by another thread's execve): its
    process was ended inside it, and what it did, if anything, the trace cannot tell."""


_LINE = re.compile(r"^(\d+)\s+(.*)$")
_DUMP = re.compile(r"^ \| [0-9a-f]{5,}  ")
_DUMP_WIDTH = 48  # sixteen bytes as hex pairs, a double space after the eighth
_RESUMED = re.compile(r"^<\.\.\. (\w+) resumed>(.*)$")
_RET = re.compile(r"^\s*=\s*(0x[0-9a-f]+|-?\d+|\?)(?:<(.*)>)?")
_DECORATED = re.compile(r"^(-?\d+)<(.*)>(\(deleted\))?$", re.S)
_UNFINISHED = " <unfinished ...>"
_SOCKET = re.compile(r"[A-Za-z0-9_-]+:\[[^\]>]*(?:->[^\]]*)?\]")
_PID_CHANGED = re.compile(r" <pid changed to (\d+) \.\.\.>$")
_SUPERSEDED = re.compile(r"^\+\+\+ superseded by execve in (?:pid|thread) (\d+) \+\+\+$")


def split_args(text: str) -> tuple[list[str], str]:
    """Split ``a, b, {c, d}, "e,f")`` at top-level commas; return the arguments and what
    follows the closing parenthesis."""
    args: list[str] = []
    depth = 0
    start = 0
    i = 0
    n = len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == "<" and i > 0 and (text[i - 1].isdigit() or text[i - 1] == "]"):
            # a decoration: a path that may hold any character but an unescaped '>', or a
            # socket's "UNIX-STREAM:[1->2]" (a '>' inside its brackets; never a path,
            # which strace gives absolute)
            i += 1
            socket = _SOCKET.match(text, i)
            if socket is not None:
                i = socket.end()
            while i < n and text[i] != ">":
                i += 2 if text[i] == "\\" else 1
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                if text[start:i].strip():
                    args.append(text[start:i].strip())
                return args, text[i + 1 :]
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[start:i].strip())
            start = i + 1
        i += 1
    if text[start:].strip():
        args.append(text[start:].strip())
    return args, ""


_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|.)", re.S)
_SIMPLE = {"n": 10, "t": 9, "r": 13, "v": 11, "f": 12, "a": 7, "b": 8, "e": 27}


def unescape(text: str) -> str:
    """A C string as strace prints it (quotes and a trailing ``...`` allowed), decoded.
    strace's ellipsis (a string cut at ``-s``) follows the closing quote; a name's own
    trailing dots (``w...``, unquoted in a descriptor's ``<path>``) are kept (s15 attack)."""
    if text.endswith('"...'):
        text = text[:-3]
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        text = text[1:-1]
    out = bytearray()
    pos = 0
    for m in _ESCAPE.finditer(text):
        out += text[pos : m.start()].encode("utf-8", "surrogateescape")
        e = m[1]
        if e[0] == "x":
            out.append(int(e[1:], 16))
        elif e[0] in "01234567":
            out.append(int(e, 8) & 0xFF)
        else:
            out.append(_SIMPLE.get(e, ord(e)))
        pos = m.end()
    out += text[pos:].encode("utf-8", "surrogateescape")
    return out.decode("utf-8", "surrogateescape")


def fd_arg(text: str) -> tuple[int, str | None]:
    """``3</some/path>`` as (3, "/some/path"); ``-100</cwd>`` (AT_FDCWD) likewise; a file
    no name leads to any more, ``3</some/path>(deleted)``, as (3, "/some/path (deleted)")
    (never mistaken for the file now at that name)."""
    m = _DECORATED.match(text)
    if m:
        return int(m[1]), unescape(m[2]) + (" (deleted)" if m[3] else "")
    try:
        return int(text, 0), None
    except ValueError:
        return -1, None


def int_arg(text: str) -> int:
    """An integer argument (decimal or hex); -1 when it is not one."""
    try:
        return int(text.split("<", 1)[0], 0)
    except ValueError:
        return -1


def _decode_dump(hexpart: str, into: bytearray) -> None:
    into += bytes.fromhex("".join(hexpart.split()))


def _never_returned(tid: int, head: tuple[str, int] | None) -> Iterator[Call]:
    """A call of ``tid`` left unfinished when another thread's execve ended it."""
    if head is None or "(" not in head[0]:
        return
    paren = head[0].index("(")
    args = split_args(head[0][paren + 1 :])[0]
    yield Call(tid, head[0][:paren], args, None, line=head[1], start=head[1], unfinished=True)


def read_calls(trace: Path) -> Iterator[Call]:
    """The completed calls of a trace file, in completion order."""
    pending: dict[int, tuple[str, int]] = {}
    last: Call | None = None
    with open(trace, encoding="utf-8", errors="surrogateescape") as f:
        for number, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if line.startswith(" | "):
                m = _DUMP.match(line)
                if m and last is not None:
                    _decode_dump(line[m.end() : m.end() + _DUMP_WIDTH], last.data)
                continue
            if line.startswith(" * "):  # "N bytes in buffer K" of writev: the dump follows
                continue
            m = _LINE.match(line)
            if m is None:
                continue
            if last is not None:
                yield last
                last = None
            tid, text, start = int(m[1]), m[2], number
            former: int | None = None
            if text.endswith(_UNFINISHED):
                pending[tid] = (text[: -len(_UNFINISHED)], number)
                continue
            changed = _PID_CHANGED.search(text)
            superseded = _SUPERSEDED.match(text)
            if changed is not None:
                # "T execve(...) <pid changed to L ...>": thread T's execve succeeded and
                # T is now L, its process's leader ("<... execve resumed>" under L follows)
                tid, former, text = int(changed[1]), tid, text[: changed.start()] + ") = 0"
                yield from _never_returned(tid, pending.pop(tid, None))
            elif superseded is not None:
                # older strace: "L +++ superseded by execve in thread T +++", T's execve
                # left unfinished: it returns in L
                head = pending.pop(int(superseded[1]), None)
                yield from _never_returned(tid, pending.pop(tid, None))
                if head is None or not head[0].startswith("execve"):
                    continue
                former, text, start = int(superseded[1]), head[0] + ") = 0", head[1]
            r = None if changed or superseded else _RESUMED.match(text)
            if r is not None:
                head = pending.pop(tid, None)
                if head is None or not head[0].startswith(r[1] + "("):
                    continue  # an execve resumed after its thread became the leader
                text, start = head[0] + r[2], head[1]
            paren = text.find("(")
            if paren <= 0:
                continue
            name = text[:paren]
            args, rest = split_args(text[paren + 1 :])
            rm = _RET.match(rest)
            ret: int | None = None
            ret_path: str | None = None
            if rm is not None and rm[1] != "?" and not rest.lstrip("= ").startswith("-1 E"):
                ret = int(rm[1], 0)
                ret_path = unescape(rm[2]) if rm[2] is not None else None
            last = Call(tid, name, args, ret, ret_path, line=number, start=start, former=former)
            last.unfinished = rm is not None and rm[1] == "?"
    if last is not None:
        yield last
