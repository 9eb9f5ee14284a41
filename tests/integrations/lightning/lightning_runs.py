"""A client of the fork server ``lightning_child.py --serve``: start, wait for and kill
training runs (a module of its own, so the tests import it by a name no other test uses)."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

import pytest

CHILD = Path(__file__).with_name("lightning_child.py")


class Runs:
    """A client of ``lightning_child.py --serve``: start, wait for and kill training runs."""

    def __init__(self, proc: subprocess.Popen[str], logs: Path) -> None:
        self.proc = proc
        self.logs = logs
        self.count = 0

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, "the fork server died"
        reply: dict[str, Any] = json.loads(line)
        return reply

    def start(self, config: dict[str, Any], env: dict[str, str] | None = None) -> tuple[int, Path]:
        """Start one run; its pid and its log file."""
        self.count += 1
        log = self.logs / f"run{self.count}.log"
        reply = self._ask({"start": config, "env": env or {}, "log": str(log)})
        return int(reply["pid"]), log

    def wait(self, pid: int, timeout: float = 120) -> int | None:
        """The run's exit code (minus the signal that ended it), None if it still runs."""
        status = self._ask({"wait": pid, "timeout": timeout})["status"]
        return None if status is None else int(status)

    def kill(self, pid: int) -> int:
        return int(self._ask({"kill": pid})["status"])

    def run(self, config: dict[str, Any]) -> int:
        """Run one single-process training run to its end; its exit status."""
        pid, log = self.start(config)
        status = self.wait(pid)
        if status is None:
            self.kill(pid)
            pytest.fail(f"run {config} did not end; log: {log.read_text()[-3000:]}")
        if status not in (0, -signal.SIGKILL):
            pytest.fail(f"run {config} failed ({status}): {log.read_text()[-3000:]}")
        return status

    def run_ranks(self, config: dict[str, Any], world: int = 2) -> list[int]:
        """Run one DDP run as ``world`` processes; the exit statuses by rank.

        When rank 0 is SIGKILLed the others (stuck in a collective, or failing on the lost
        connection) are killed too, whatever their state.
        """
        port = free_port()
        started = [
            self.start(
                config,
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "WORLD_SIZE": str(world),
                    "NODE_RANK": "0",
                    "LOCAL_RANK": str(rank),
                },
            )
            for rank in range(world)
        ]
        statuses: list[int | None] = [None] * world
        statuses[0] = self.wait(started[0][0])
        if statuses[0] is None:
            for pid, _ in started:
                self.kill(pid)
            pytest.fail(f"rank 0 did not end: {started[0][1].read_text()[-3000:]}")
        for rank in range(1, world):
            pid = started[rank][0]
            statuses[rank] = self.kill(pid) if statuses[0] == -signal.SIGKILL else self.wait(pid)
        for rank, status in enumerate(statuses):
            if rank > 0 and statuses[0] == -signal.SIGKILL:
                continue  # killed by us, or ended by the error its lost peer caused
            if status not in (0, -signal.SIGKILL):
                log = started[rank][1].read_text()[-3000:]
                pytest.fail(f"rank {rank} of {config} failed ({status}): {log}")
        return [int(s) for s in statuses if s is not None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
