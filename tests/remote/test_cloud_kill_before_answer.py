"""A writer process SIGKILLed between its manifest write and the answer: a TCP proxy holds
the answer (the server has applied the write), kills the writer, then resets the
connection. The step is the killed writer's, whole (its data was verified before the
write); a replaced step's old attempt is garbage that ``clean`` collects, never the new
one's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _emulators import Emulator, env_without_cloud, fast_root, options_through
from _remote_support import CuttingProxy, read_tree, write_tree

CHILD = Path(__file__).resolve().parent / "_cloud_child.py"


@pytest.mark.parametrize("replace", [False, True], ids=["create", "replace"])
def test_a_writer_killed_before_its_manifest_answer_leaves_its_step_whole(
    emulator: Emulator, cloud_url: str, tmp_path: Path, *, replace: bool
) -> None:
    """The step shows the killed writer's files bit-exact; after clean(grace=0) only the
    objects its manifest names are left."""
    direct = fast_root(emulator, cloud_url, tmp_path)
    if replace:
        with direct.commit(2) as path:
            write_tree(path, 9)
    pids: list[int] = []
    proxy = CuttingProxy(emulator.endpoint, cut=1, on_cut=lambda: os.kill(pids[0], signal.SIGKILL))
    try:
        argv = [sys.executable, str(CHILD), cloud_url]
        argv += [json.dumps(options_through(emulator, proxy.endpoint)), "2", "2"]
        argv += ["--staging", str(tmp_path / "staging-child")]
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_cloud()
        )
        pids.append(proc.pid)
        _, err = proc.communicate(timeout=300)
    finally:
        proxy.stop()
    assert proc.returncode == -9, err[-2000:]
    assert proxy.cuts == 1, "the manifest write's answer was not held"
    assert b" 20" in proxy.answers[0], proxy.answers  # applied by the server
    expected = write_tree(tmp_path / "expected", 2)
    assert direct.steps() == [2]
    assert read_tree(direct.fetch(2, tmp_path / "got").path) == expected
    attempt = direct.get(2).attempt
    removed = direct.clean(grace=0)
    assert len(removed) == (1 if replace else 0), removed
    assert all(attempt not in url for url in removed)
    left = set(direct._store.find(""))
    assert left == {"2/checkpoint_complete"} | {f"2/{attempt}/{rel}" for rel in expected}
    assert read_tree(direct.fetch(2, tmp_path / "again").path) == expected
