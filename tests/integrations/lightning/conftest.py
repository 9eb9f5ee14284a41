"""Fixtures for the Lightning tests: a fork server that runs training runs in child processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from lightning_runs import CHILD, Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """The fork server (Lightning imported once), for the whole session."""
    logs = tmp_path_factory.mktemp("lightning_logs")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with (logs / "server.log").open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        ready = proc.stdout.readline()
        if not ready:
            proc.wait()
            pytest.fail(f"the fork server did not start: {(logs / 'server.log').read_text()}")
        try:
            yield Runs(proc, logs)
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=60)
