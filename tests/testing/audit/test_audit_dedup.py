"""The audit of a script that carries and deduplicates (commit carry= and dedup=True, a
rewrite of a step, then pruning the source): clean under kill and power."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _audit_scripts import needs_strace, script

from atomic_ckpt.testing import audit

# The slow tier (docs/contributing.md): hundreds of forked checks from a worker that has
# imported torch cost minutes there; the carry simulation of the main run
# (tests/testing/test_carry_simulation.py) covers the same crash states of a carry in kind.
pytestmark = [needs_strace, pytest.mark.slow]

FROZEN = "bytes(range(256)) * 16"

INCREMENTAL = f"""\
# Saves that write only what changed: frozen.bin is carried or deduplicated, never rewritten.
import json, sys
from atomic_ckpt import CheckpointDir
ckpts = CheckpointDir(sys.argv[1])
frozen = {FROZEN}
def files(path, fill):
    (path / "tok").mkdir(exist_ok=True)
    (path / "tok" / "vocab.json").write_text('{{"a": 1}}')
    (path / "weights.bin").write_bytes(bytes([fill]) * 4096)
    (path / "meta.json").write_text(json.dumps({{"fill": fill}}))
with ckpts.commit(1) as path:  # everything written
    (path / "frozen.bin").write_bytes(frozen)
    files(path, 1)
with ckpts.begin(1, dedup=True) as rewrite:  # a rewrite of step 1, deduped against its old save
    (rewrite.path / "frozen.bin").write_bytes(frozen)
    files(rewrite.path, 11)
with ckpts.begin(2, dedup=True) as commit:  # frozen.bin carried, the tokenizer deduped
    how = commit.carry("frozen.bin", from_=1)
    files(commit.path, 2)
ckpts.prune(keep_last=1)  # the source goes
print(json.dumps({{"rewrite": rewrite.deduped, "carry": how, "next": commit.deduped}}))
"""


def check(root: Path) -> None:
    """Every complete checkpoint is whole: its frozen file, its own weights, and verify()."""
    import json

    from atomic_ckpt import CheckpointDir

    ckpts = CheckpointDir(root)
    for ckpt in ckpts.checkpoints():
        assert (ckpt.path / "frozen.bin").read_bytes() == bytes(range(256)) * 16, "frozen"
        fill = json.loads((ckpt.path / "meta.json").read_text())["fill"]
        assert (ckpt.path / "weights.bin").read_bytes() == bytes([fill]) * 4096, "weights"
        assert (ckpt.path / "tok" / "vocab.json").read_text() == '{"a": 1}', "vocab"
        ckpts.verify(ckpt.step)


def test_a_carrying_and_deduplicating_script_is_clean(tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    workload = [*script(tmp_path, "incremental.py", INCREMENTAL), str(root)]
    report = audit(workload, check, root=root)
    assert report.ok, report
    assert report.states["kill"] > 10
    assert report.states["power"] > 10
    assert report.verdict.startswith("clean")
    # What was audited links on this filesystem (run once more, untraced, to see how).
    ran = subprocess.run(
        [*workload[:-1], str(tmp_path / "again")], capture_output=True, text=True, check=True
    )
    hows = json.loads(ran.stdout.splitlines()[-1])
    assert set(hows["rewrite"]) == {"frozen.bin", "tok/vocab.json"}
    assert set(hows["next"]) == {"tok/vocab.json"}
    if hows["carry"] != "hardlink":
        return  # a reflink filesystem: the trace does not see FICLONE (an ioctl)
    assert set(hows["rewrite"].values()) == {"hardlink"}
