"""Writer processes racing for one gs:// or az:// step through a real TCP proxy that loses
the answer to the first manifest write to reach the server (applied, then the client's
connection reset): exactly one writer commits, every other is told another writer
committed first (StepConflictError), and the step's manifest names the winner's attempt,
whose objects are exactly the winner's files. The cut is asserted to have happened."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _emulators import Emulator, env_without_cloud, fast_root, options_through
from _remote_support import CuttingProxy, read_tree, write_tree

CHILD = Path(__file__).resolve().parent / "_cloud_child.py"


@pytest.mark.parametrize("refuse_for", [0.0, 1.2], ids=["answer-lost", "then-refused"])
@pytest.mark.parametrize("replace", [False, True], ids=["create", "replace"])
def test_racing_writers_one_of_whose_manifest_answers_is_lost_get_one_winner(
    emulator: Emulator, cloud_url: str, tmp_path: Path, *, replace: bool, refuse_for: float
) -> None:
    """Three processes publish step 5 at once; the first manifest write's answer is lost
    (then, in ``then-refused``, every connection is closed and none made for 1.2 s): one
    commits, two get StepConflictError, the manifest names the winner's attempt and its
    objects are exactly the winner's files."""
    direct = fast_root(emulator, cloud_url, tmp_path)
    if replace:
        with direct.commit(5) as path:
            write_tree(path, 9)
    proxy = CuttingProxy(emulator.endpoint, cut=1, refuse_for=refuse_for)
    try:
        options = json.dumps(options_through(emulator, proxy.endpoint))
        go = tmp_path / "go"
        procs = {}
        for seed in (1, 2, 3):
            ready = tmp_path / f"ready-{seed}"
            argv = [sys.executable, str(CHILD), cloud_url, options, "5", str(seed)]
            argv += ["--staging", str(tmp_path / f"staging-{seed}"), "--linear-retry"]
            argv += ["--ready", str(ready), "--go", str(go)]
            proc = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env_without_cloud(),
            )
            procs[seed] = (ready, proc)
        for ready, proc in procs.values():
            while not ready.exists():
                assert proc.poll() is None, proc.communicate()
                time.sleep(0.01)
        go.touch()
        outcomes = {}
        for seed, (_, proc) in procs.items():
            out, err = proc.communicate(timeout=300)
            assert proc.returncode in (0, 3), err[-3000:]
            outcomes[seed] = json.loads(out)
    finally:
        proxy.stop()
    assert proxy.cuts == 1, "no manifest write's answer was lost"
    assert proxy.answers, proxy.answers
    assert proxy.writes >= 4, proxy.writes  # three writers and the cut one's retry
    winners = [s for s, o in outcomes.items() if o["outcome"] == "committed"]
    assert len(winners) == 1, outcomes
    for seed, o in outcomes.items():
        if seed not in winners:
            assert "another writer committed this step first" in o["error"], o
    ckpt = direct.get(5)
    assert ckpt.attempt == outcomes[winners[0]]["attempt"]
    expected = write_tree(tmp_path / "expected", winners[0])
    attempt_objects = sorted(
        key.split("/", 2)[2] for key in direct._store.find(f"5/{ckpt.attempt}/")
    )
    assert attempt_objects == sorted(expected)
    assert read_tree(direct.fetch(5, tmp_path / "got").path) == expected
