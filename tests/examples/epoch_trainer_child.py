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
"""

from __future__ import annotations

import argparse
import importlib.util
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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--term-at-step", type=int, default=0)
    parser.add_argument("--kill", default="")
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
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


if __name__ == "__main__":
    sys.exit(main())
