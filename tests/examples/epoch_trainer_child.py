"""Runs examples/epoch_trainer.py with the faults tests/test_epoch_trainer.py asks for.

Usage::

    python epoch_trainer_child.py [--term-at-step N] [--kill FUNC:REGEX:K[:after]] -- TRAINER_ARGS

* ``--term-at-step N``: after the Nth training step of this process, send itself
  SIGTERM (a preemption), as a scheduler would; the trainer acts on it itself.
* ``--kill FUNC:REGEX:K``: SIGKILL itself just before (``:after``: just after)
  the Kth call of ``atomic_ckpt._core.l2_syscalls.fs.FUNC`` whose first path argument matches
  REGEX. It prints ``killing FUNC PATH`` first, so the test knows the fault fired.

The example is imported as a module and run through its ``main``: nothing in it
knows about the test.

``python epoch_trainer_child.py --serve`` imports torch and the library once and then
forks one child per request (a JSON line on stdin: the arguments above, and the files the
child's stdout and stderr go to), answering with the child's pid and then its exit status
as ``subprocess`` gives it (``-9`` for SIGKILL). A run costs its training, not the start
of an interpreter that imports torch (most of a run's time here); what the child runs is
what a fresh ``python epoch_trainer_child.py ...`` would, in a process of its own.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import sys
from pathlib import Path
from typing import Any

from atomic_ckpt._core.l2_syscalls import fs as _fs

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "epoch_trainer.py"


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--term-at-step", type=int, default=0)
    parser.add_argument("--kill", default="")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    trainer_args = [a for a in args.trainer_args if a != "--"]

    spec = importlib.util.spec_from_file_location("epoch_trainer", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    trainer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trainer)

    if args.term_at_step:
        real_step = trainer.train_step
        steps = 0

        def train_step(*a: Any) -> None:
            nonlocal steps
            real_step(*a)
            steps += 1
            if steps == args.term_at_step:
                say(f"sending SIGTERM after step {steps}")
                os.kill(os.getpid(), signal.SIGTERM)

        trainer.train_step = train_step

    if args.kill:
        name, pattern, nth, *when = args.kill.split(":")
        real = getattr(_fs, name)
        matched = 0

        def hooked(*a: Any, **k: Any) -> Any:
            nonlocal matched
            hit = a and re.search(pattern, str(a[0])) is not None
            if hit:
                matched += 1
            fire = hit and matched == int(nth)
            if fire and when != ["after"]:
                say(f"killing {name} {a[0]}")
                os.kill(os.getpid(), signal.SIGKILL)
            out = real(*a, **k)
            if fire:
                say(f"killing {name} {a[0]} after")
                os.kill(os.getpid(), signal.SIGKILL)
            return out

        setattr(_fs, name, hooked)

    return int(trainer.main(trainer_args))


def run_forked(argv: list[str], out: str, err: str) -> None:
    """In a forked child: stdio to the files, ``main(argv)``, and exit as Python would."""
    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, out, os.O_WRONLY),
        (2, err, os.O_WRONLY),
    ):
        target = os.open(path, flags | (os.O_CREAT | os.O_TRUNC if fd else 0), 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [__file__, *argv]
    code = 1
    try:
        code = main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> int:
    """Fork a child per request line on stdin; answer with its pid, then its exit status."""
    for module in ("torch", "torch.distributed", "atomic_ckpt.torch", "atomic_ckpt.distributed"):
        importlib.import_module(module)  # what a run's start spends its time on, once

    def answer(**fields: int) -> None:
        sys.stdout.write(json.dumps(fields) + "\n")
        sys.stdout.flush()

    answer(ready=os.getpid())
    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_forked(request["argv"], request["out"], request["err"])
        answer(pid=pid)
        _, status = os.waitpid(pid, 0)
        answer(
            returncode=-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        )
    return 0


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main())
