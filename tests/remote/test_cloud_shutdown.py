"""A training script on a gs:// or az:// root that ends while its Mirror's (or
AsyncRemoteCommitter's) upload of step 1 is in flight, held at the manifest write: the
training loop crashes, or crashes inside the worker's ``with`` block, or ``close()`` is
interrupted (SIGINT). The step is never half-visible; the upload in flight is finished
before the process exits, so the step appears whole; an upload that fails then is
reported (the exit status is non-zero and stderr names the step) and leaves no step."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _emulators import Emulator, env_without_cloud, fast_root
from _remote_support import read_tree, write_tree
from procutil import wait_until_blocked

CHILD = Path(__file__).resolve().parent / "_shutdown_child.py"


@pytest.mark.parametrize("fail", [False, True], ids=["upload-ok", "upload-fails"])
@pytest.mark.parametrize("how", ["crash", "with-block", "interrupt-close"])
@pytest.mark.parametrize("kind", ["mirror", "async"])
def test_a_script_ending_mid_upload_finishes_or_reports_it(
    emulator: Emulator, cloud_url: str, tmp_path: Path, kind: str, how: str, *, fail: bool
) -> None:
    """While the manifest write is held the step is not visible; once released, the
    process exits non-zero (the crash, the interrupt), the step is whole if the upload
    succeeded, and if it failed stderr names the failed upload of step 1 and no step is
    there."""
    holding, go = tmp_path / "holding", tmp_path / "go"
    argv = [sys.executable, str(CHILD), cloud_url, json.dumps(emulator.options())]
    argv += [str(tmp_path / "local"), kind, how, str(holding), str(go)]
    argv += ["--fail"] if fail else []
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_cloud()
    )
    rdir = fast_root(emulator, cloud_url, tmp_path)
    try:
        while not holding.exists():
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.01)
        # Blocked in close() (interrupted), or, the training loop having raised, in the
        # interpreter's exit, which waits for the upload.
        wait_until_blocked(proc.pid)
        if how == "interrupt-close":
            proc.send_signal(signal.SIGINT)
        with pytest.raises(subprocess.TimeoutExpired):  # held: it cannot end before "go"
            proc.wait(timeout=1.0)
        assert rdir.steps() == []
        go.touch()
        _, err = proc.communicate(timeout=120)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err
    if how == "interrupt-close":
        assert "KeyboardInterrupt" in err, err
    else:
        assert "RuntimeError: the training loop crashed" in err, err
    if not fail:
        assert rdir.steps() == [1], err
        assert read_tree(rdir.fetch(1, tmp_path / "got").path) == write_tree(tmp_path / "x", 1)
        assert "failed" not in err, err
        return
    assert re.search(r"fault fired [1-9]", err), err
    assert rdir.steps() == []
    what = "mirror upload" if kind == "mirror" else "background commit"
    assert f"{what} of step 1 failed" in err, err
    assert rdir.clean(grace=0), "the failed upload left nothing to clean"
