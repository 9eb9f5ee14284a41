"""The DeepSpeed recipe (``examples/hf_deepspeed.py``) on 2 CPU ranks under torchrun:
``engine.save_checkpoint`` inside ``distributed_commit``, resumed bit-identical.

DeepSpeed is not in the extras: this runs where ``deepspeed`` is importable
(``DS_ACCELERATOR=cpu`` falls back to gloo) and is skipped elsewhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

from atomic_ckpt import CheckpointDir  # noqa: E402

EXAMPLE = Path(__file__).parents[3] / "examples" / "hf_deepspeed.py"


def torchrun(run_dir: Path, steps: int) -> str:
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    # --standalone: torchrun picks a free port itself (no race for one with other jobs).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += [str(EXAMPLE), str(run_dir), str(steps)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


# The slow tier (docs/contributing.md): three torchruns of two DeepSpeed ranks, 39 s of CPU
# alone (-n 0) and the main tier's costliest test beside other work (117 s CPU, the gloo
# ranks spinning while they wait). The main tier keeps the recipe in kind: the DeepSpeed
# guide's blocks (tests/docs/test_doc_snippets.py, docs/guides/deepspeed.md) save with
# engine.save_checkpoint inside distributed_commit and load what resume() chose, and
# tests/distributed/test_distributed.py commits every rank's files as one checkpoint.
@pytest.mark.slow
def test_deepspeed_checkpoints_commit_atomically_and_resume_bit_identical(
    tmp_path: Path,
) -> None:
    """Every rank's ZeRO shards land in one complete checkpoint per step, with no `latest`
    file; a run stopped at step 4 and restarted ends with the same step-6 checkpoint
    as a run never stopped."""
    ref, run = tmp_path / "ref", tmp_path / "run"
    assert "done 6" in torchrun(ref, 6)
    assert "resumed 0" in torchrun(run, 4)
    assert "resumed 4" in torchrun(run, 6)
    for root in (ref, run):
        ckpts = CheckpointDir(root)
        assert ckpts.steps() == [4, 6]
        files = {f.path for f in ckpts.verify(6).manifest.files}
        assert {"ds/zero_pp_rank_0_mp_rank_00_optim_states.pt"} <= files
        assert {"ds/zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= files
        assert not any(f.endswith("latest") for f in files)
        assert sorted(os.listdir(root)) == ["4", "6"]
    # DeepSpeed's model states hold more than tensors; these are files this test wrote.
    a = torch.load(ref / "6/ds/mp_rank_00_model_states.pt", weights_only=False)["module"]
    b = torch.load(run / "6/ds/mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
