"""``atomic-ckpt audit``: the command line of :func:`atomic_ckpt.testing.audit`.

Exit status: 0 no violation, 1 violations, 2 anything else: nothing was judged (strace
missing, a recorded run that failed or outlived --record-timeout, a recording that cannot
rebuild the tree or holds nothing under DIR, an interrupted audit, an error of the audit
itself), said in one line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atomic_ckpt.testing.audit import AUDIT_MODELS, AuditError, adopt_orphans, audit

EXIT_CLEAN, EXIT_VIOLATIONS, EXIT_ERROR = 0, 1, 2

_DESCRIPTION = """\
Run a workload (a small configuration of your training: a tiny model, a few saves)
once under strace, recording every filesystem operation its processes make under DIR;
rebuild DIR as a process kill and a power loss would leave it at every operation
boundary; show each distinct state at DIR itself (the original DIR is set aside and put
back afterwards) and run the check on it, typically your own resume, exiting non-zero
when it cannot load the newest checkpoint. A state whose check fails is a violation.
Exit status: 0 no violation, 1 violations, 2 usage or environment error."""


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``audit`` to an ``add_subparsers()`` object; returns its parser."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "audit",
        help="crash-test any training script's checkpointing (kill and power loss)",
        description=_DESCRIPTION,
        usage="%(prog)s --root DIR (--check CMD | --check-python MODULE:FUNCTION) "
        "[--models kill,power] [--json FILE] [--max-states N] [--jobs N] "
        "[--record-timeout SECONDS] -- CMD [ARG...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--root", required=True, metavar="DIR", help="the checkpoint directory")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--check",
        metavar="CMD",
        help="a shell command run on each crash state (non-zero exit: a violation)",
    )
    how.add_argument(
        "--check-python",
        metavar="MODULE:FUNCTION",
        help="a function called with DIR's path in a child forked per state (imports "
        "are paid once); raising or returning False is a violation",
    )
    p.add_argument(
        "--models",
        default=",".join(AUDIT_MODELS),
        type=_models,
        help="crash models, comma-separated (default kill,power)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    p.add_argument(
        "--max-states",
        type=_positive,
        metavar="N",
        help="check at most N distinct states, sampled (see --seed)",
    )
    p.add_argument("--seed", type=int, default=0, help="the sampling seed (default 0)")
    p.add_argument(
        "--jobs",
        type=_positive,
        default=1,
        metavar="N",
        help="run N checks at once in private mount namespaces (needs root; default 1)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a check running longer is killed and counts as a violation (default 600)",
    )
    p.add_argument(
        "--record-timeout",
        type=float,
        default=3600.0,
        metavar="SECONDS",
        help="end the recorded run after this long, naming the processes still running "
        "(a daemon the workload left keeps it open; default 3600); exit 2",
    )
    p.add_argument(
        "--show",
        type=int,
        default=10,
        metavar="N",
        help="print the first N violations in full (default 10; --json has all)",
    )
    p.add_argument("workload", nargs=argparse.REMAINDER, metavar="-- CMD [ARG...]")
    return p


def _models(text: str) -> tuple[str, ...]:
    models = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in models if m not in AUDIT_MODELS]
    if bad or not models:
        raise argparse.ArgumentTypeError(f"choose from {','.join(AUDIT_MODELS)}")
    return models


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _function(spec: str) -> Callable[[Path], object]:
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise AuditError(f"--check-python wants MODULE:FUNCTION, not {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a SyntaxError, or whatever its import raises
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise AuditError(f"--check-python {spec}: importing {module_name} failed ({why})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AuditError(f"{module_name} has no function {name!r}")
    checked: Callable[[Path], object] = fn
    return checked


def _json_target(spec: str, root: str) -> Path:
    """Check up front that the report can be written to ``spec`` (opened for appending,
    which creates it and truncates nothing), so that an unwritable path is an error before
    the workload is recorded, not after every state was checked. A file this check
    creates is removed again: the audit may still fail."""
    path = Path(spec)
    inside = os.path.realpath(path)
    top = os.path.realpath(root)
    if inside == top or inside.startswith(top.rstrip(os.sep) + os.sep):
        raise AuditError(
            f"--json {spec} is inside the audited directory {root}, which the audit moves "
            f"aside and replaces with each crash state; write the report elsewhere"
        )
    existed = os.path.lexists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        raise AuditError(
            f"--json {spec} cannot be written ({why}); give a path in a writable "
            f"directory (nothing was recorded)"
        ) from None
    if not existed:
        path.unlink()
    return path


def run(args: argparse.Namespace) -> int:
    """Run the audit the parsed ``args`` describe; print the report; return the exit status."""
    workload = list(args.workload)
    if workload[:1] == ["--"]:
        workload = workload[1:]
    if not workload:
        print(
            "atomic-ckpt audit: error: give the workload after --: -- CMD [ARG...]", file=sys.stderr
        )
        return EXIT_ERROR
    adopt_orphans()  # a daemon a check starts ends with the check (s15 attack)
    try:
        json_path = None if args.json is None else _json_target(args.json, args.root)
        check = args.check if args.check is not None else _function(args.check_python)
        report = audit(
            workload,
            check,
            root=args.root,
            models=args.models,
            max_states=args.max_states,
            seed=args.seed,
            jobs=args.jobs,
            timeout=args.timeout,
            record_timeout=args.record_timeout,
        )
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM/SIGHUP (the audit raises it for them)
        print(f"atomic-ckpt audit: interrupted; {args.root} is as it was", file=sys.stderr)
        return EXIT_ERROR
    except (AuditError, OSError, ValueError, ImportError) as exc:
        print(f"atomic-ckpt audit: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # nothing was judged: never the status of a violation
        why = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(
            f"atomic-ckpt audit: error: the audit failed ({why}); nothing was judged; this is "
            f"a defect of the audit, please report it",
            file=sys.stderr,
        )
        return EXIT_ERROR
    print(report.render(limit=args.show))
    if json_path is not None:
        try:
            json_path.write_text(report.to_json() + "\n")
        except OSError as exc:  # it could be written when the audit began
            print(
                f"atomic-ckpt audit: error: the verdict is above, but --json {args.json} "
                f"could not be written ({exc.strerror or type(exc).__name__})",
                file=sys.stderr,
            )
            return EXIT_ERROR
    return EXIT_CLEAN if report.ok else EXIT_VIOLATIONS
