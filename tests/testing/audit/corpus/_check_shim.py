"""The corpus harness's check: a case's ``check.py`` run as ``python check.py ROOT`` would
run it (``__main__``, ``sys.argv``, its exit status), but in the child the audit forks per
state (``--check-python _check_shim:check``), without an interpreter's start-up each time."""

import os
import runpy
import sys

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check.py")


def check(root: str) -> None:
    """Reject the state (raise) when check.py exits non-zero."""
    sys.argv = [CHECK, os.fspath(root)]
    try:
        runpy.run_path(CHECK, run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0, False):
            raise AssertionError(f"check.py exited with {exc.code!r}") from None
