"""examples/epoch_trainer.py end to end: SIGKILLed during a save, during the validation
amend, around a SIGTERM-interrupted save and its promotion, it resumes and ends
bit-identical to a run that was never stopped; a legacy root needs --fresh."""

from __future__ import annotations

import hashlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from treeutil import contents, write

from atomic_ckpt import BEST_LINK, TMP_INFIX, CheckpointDir

pytest.importorskip("torch")
pytest.importorskip("safetensors")

CHILD = Path(__file__).with_name("epoch_trainer_child.py")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "epoch_trainer.py"
ARGS = ["--epochs", "4", "--steps-per-epoch", "5"]
"""Four epochs of five steps: global steps 1-20, a SIGTERM at step 7 lands in epoch 1."""


@dataclass
class Run:
    returncode: int
    out: str
    err: str

    def line(self, prefix: str) -> str | None:
        return next((ln for ln in self.out.splitlines() if ln.startswith(prefix)), None)


class Forker:
    """The child's ``--serve`` mode: one process that imported torch forks each run."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            bufsize=0,
        )
        self.buffer = b""
        assert "ready" in self.answer()

    def answer(self) -> dict[str, int]:
        """The next line the server wrote (unbuffered: a line read ahead is kept here)."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + TIMEOUT
        while b"\n" not in self.buffer:
            wait = max(deadline - time.monotonic(), 0)
            ready, _, _ = select.select([self.proc.stdout], [], [], wait)
            chunk = os.read(self.proc.stdout.fileno(), 4096) if ready else b""
            assert chunk, f"the --serve process gave no answer (exit {self.proc.poll()})"
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return dict(json.loads(line))

    def run(self, argv: list[str], out: Path, err: Path) -> int:
        """Fork a run of ``python CHILD *argv``: its exit status (-9: SIGKILLed)."""
        assert self.proc.stdin is not None
        request = {"argv": argv, "out": str(out), "err": str(err)}
        self.proc.stdin.write(json.dumps(request).encode() + b"\n")
        pid = self.answer()["pid"]
        try:
            return self.answer()["returncode"]
        except BaseException:
            os.kill(pid, signal.SIGKILL)
            raise

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=TIMEOUT)


TIMEOUT = 180
_FORKER: list[Forker] = []


@pytest.fixture(scope="module", autouse=True)
def _forker() -> Iterator[None]:
    """The module's forking server, ended after its last test."""
    yield
    while _FORKER:
        _FORKER.pop().close()


def train(root: Path, *faults: str, trainer_args: tuple[str, ...] = ()) -> Run:
    """Run the example (through the fault-injecting child) on ``root``, in a process of its
    own: forked by the child's ``--serve`` process, as ``python CHILD ...`` would run it."""
    if not _FORKER:
        _FORKER.append(Forker())
    argv = [*faults, "--", str(root), *ARGS, *trainer_args]
    out, err = root.parent / f"{root.name}.out", root.parent / f"{root.name}.err"
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        returncode = _FORKER[0].run(argv, out, err)
    except BaseException:
        server = _FORKER.pop()  # its answers are out of step now: the next run starts anew
        server.proc.kill()
        server.proc.wait()
        raise
    return Run(returncode, out.read_text(), err.read_text())


def state(root: Path) -> dict[str, Any]:
    """Everything a resumed run must reproduce: every kept checkpoint's bytes and metadata,
    the best pointer and the aliases. Checks on the way that everything verifies, that no
    alias dangles and that nothing is left behind."""
    ckpts = CheckpointDir(root)
    assert [p.name for p in ckpts.clean()] == [], "a finished run leaves nothing to clean"
    assert sorted(n for n in os.listdir(root) if TMP_INFIX in n) == []
    best = ckpts.best()
    links = {
        n: os.readlink(root / n)
        for n in os.listdir(root)
        if (root / n).is_symlink() and n != BEST_LINK
    }
    for alias, target in links.items():
        assert ckpts.verify(int(target)), f"alias {alias} dangles"
    out: dict[str, Any] = {
        "steps": ckpts.steps(),
        "best": best.step if best else None,
        "aliases": links,
        "named": [n.name for n in ckpts.named()],
    }
    for step in ckpts.steps():
        ckpt = ckpts.verify(step)
        files = contents(ckpt.path)
        out[f"{step}/files"] = {k: hashlib.sha256(v).hexdigest() for k, v in files.items()}
        out[f"{step}/metadata"] = ckpt.manifest.metadata
    return out


def check_midway(root: Path) -> None:
    """After any kill: every complete step verifies and every alias names one."""
    ckpts = CheckpointDir(root)
    for step in ckpts.steps():
        ckpts.verify(step)
    for n in os.listdir(root):
        if (root / n).is_symlink() and n != BEST_LINK and TMP_INFIX not in n:
            target = os.readlink(root / n)
            assert (root / target).is_dir(), f"alias {n} -> {target} dangles"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    """An uninterrupted run: its final digest and final state."""
    root = tmp_path_factory.mktemp("reference") / "run"
    run = train(root)
    assert run.returncode == 0, run.err
    done = run.line("done ")
    assert done is not None
    return done, state(root)


def finish(root: Path, reference: tuple[str, dict[str, Any]]) -> Run:
    """Restart until done (one restart must do); the result is bit-identical to the reference."""
    run = train(root)
    assert run.returncode == 0, run.err
    assert run.line("resumed from ") is not None, run.out
    assert run.line("done ") == reference[0]
    assert state(root) == reference[1]
    return run


def test_an_uninterrupted_run_keeps_the_best_and_the_last_two(
    reference: tuple[str, dict[str, Any]],
) -> None:
    """Four epochs: the last two and the best kept, amended with val_metrics.json and val_loss,
    each with its epoch<e>_step<s> alias; nothing named is left."""
    _, final = reference
    kept = final["steps"]
    assert kept[-2:] == [2, 3]
    assert final["best"] in kept
    assert final["named"] == []
    assert final["aliases"] == {f"epoch{e}_step{5 * (e + 1)}": str(e) for e in kept}
    for e in kept:
        assert "val_metrics.json" in final[f"{e}/files"]
        assert final[f"{e}/metadata"]["epoch_complete"] is True
        assert isinstance(final[f"{e}/metadata"]["val_loss"], float)
    losses = {e: final[f"{e}/metadata"]["val_loss"] for e in kept}
    assert final["best"] == min(losses, key=losses.__getitem__)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_ranks(root: Path, world: int = 2) -> list[Run]:
    """The example on ``world`` gloo ranks, launched as torchrun does (the env:// variables)."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    procs = [
        subprocess.Popen(
            [sys.executable, str(EXAMPLE), str(root), *ARGS],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(world)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    runs = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        runs.append(Run(proc.returncode, out, err))
    return runs


def test_on_two_ranks_rank_0_saves_and_every_rank_resumes_from_its_choice(
    tmp_path: Path, reference: tuple[str, dict[str, Any]]
) -> None:
    """Under torchrun: the run directory ends as a one-process run's does (rank 0 alone
    saved), and a restart of both ranks resumes from the same checkpoint on each.

    Each rank is ``python examples/epoch_trainer.py RUN_DIR ...`` as a user types it, so
    this is also the test that the example runs as a script and a second start resumes
    and stops (a test of that on one process, two more torch-importing interpreters, was
    folded in here; the one-process path of ``main`` is what every forked run takes)."""
    root = tmp_path / "run"
    first = train_ranks(root)
    assert [r.returncode for r in first] == [0, 0], [r.err for r in first]
    assert [r.line("done ") for r in first] == [reference[0]] * 2
    assert state(root) == reference[1]
    again = train_ranks(root)
    assert [r.returncode for r in again] == [0, 0], [r.err for r in again]
    assert [r.line("resumed from ") for r in again] == ["resumed from 3: epoch 4 step 0"] * 2


def test_the_glue_is_the_lines_the_docstring_counts_and_at_most_20() -> None:
    """The example's own count of the lines it needs only to adapt to the library."""
    text = EXAMPLE.read_text()
    marked = [ln for ln in text.splitlines() if ln.rstrip().endswith("# glue") or "# glue:" in ln]
    claimed = re.search(r"are the (\d+) lines marked ``# glue``", text)
    assert claimed is not None
    assert len(marked) == int(claimed.group(1)) <= 20, marked


KILLS = {
    "during-the-save-of-epoch-1": r"fsync_file:/1\.tmp-[0-9a-f]+/optimizer\.pt$:1",
    "before-the-promotion-of-epoch-1": r"rename_noreplace:/1\.tmp-[0-9a-f]+$:1",
    "during-the-amend-of-epoch-1": r"link_or_copy:/1/model\.safetensors$:1",
    "before-the-amends-exchange": r"rename_exchange:/1\.tmp-[0-9a-f]+$:1",
    "after-the-amends-exchange": r"rename_exchange:/1\.tmp-[0-9a-f]+$:1:after",
    "during-retention-after-epoch-2": r"rename:/0$:1",
    "after-retention-moved-epoch-0-aside": r"rename:/0$:1:after",
    "during-the-last-amend": r"write_file_durable:/3\.tmp-[0-9a-f]+/checkpoint_complete$:2",
}


@pytest.mark.parametrize("kill", KILLS.values(), ids=KILLS.keys())
def test_a_run_killed_during_a_save_or_an_amend_resumes_bit_identical(
    tmp_path: Path, reference: tuple[str, dict[str, Any]], kill: str
) -> None:
    """SIGKILL inside a commit, an amend or the retention; the restart ends identical."""
    root = tmp_path / "run"
    killed = train(root, "--kill", kill)
    assert killed.returncode == -9, (killed.out, killed.err)
    assert killed.line("killing ") is not None  # the fault fired
    check_midway(root)
    finish(root, reference)


def test_a_sigterm_saves_interrupted_and_the_restart_promotes_it(
    tmp_path: Path, reference: tuple[str, dict[str, Any]]
) -> None:
    """SIGTERM mid-epoch: `interrupted` is saved, the job exits 0; the next start promotes it
    (it is newer than epoch 0) and resumes mid-epoch."""
    root = tmp_path / "run"
    stopped = train(root, "--term-at-step", "7")
    assert stopped.returncode == 0, stopped.err
    assert stopped.line("interrupted at epoch 1 step 2") is not None, stopped.out
    ckpts = CheckpointDir(root)
    assert [n.name for n in ckpts.named()] == ["interrupted"]
    assert ckpts.steps() == [0]
    run = finish(root, reference)
    assert run.line("resumed from 1: epoch 1 step 2") is not None, run.out


def test_a_kill_while_saving_interrupted_resumes_from_the_last_epoch(
    tmp_path: Path, reference: tuple[str, dict[str, Any]]
) -> None:
    """SIGTERM, then SIGKILL during the `interrupted` save: nothing named; epoch 0 resumes."""
    root = tmp_path / "run"
    killed = train(
        root, "--term-at-step", "7", "--kill", r"fsync_file:/interrupted\.tmp-[0-9a-f]+/:1"
    )
    assert killed.returncode == -9, (killed.out, killed.err)
    assert killed.line("killing ") is not None
    assert CheckpointDir(root).named() == []
    run = finish(root, reference)
    assert run.line("resumed from 0: epoch 1 step 0") is not None, run.out


PROMOTED = r"(/interrupted|/1\.tmp-[0-9a-f]+)"
"""What promote_named renames into step 1: the named dir itself, or a staging dir of links."""
PROMOTION_KILLS = {
    "during-the-marker-write": rf"write_file_durable:{PROMOTED}/checkpoint_complete$:1",
    "before-the-rename": rf"rename_noreplace:{PROMOTED}$:1",
    "after-the-rename": rf"rename_noreplace:{PROMOTED}$:1:after",
}


@pytest.mark.parametrize("kill", PROMOTION_KILLS.values(), ids=PROMOTION_KILLS.keys())
def test_a_restart_killed_while_promoting_interrupted_resumes_bit_identical(
    tmp_path: Path, reference: tuple[str, dict[str, Any]], kill: str
) -> None:
    """SIGTERM saves `interrupted`; the restart is SIGKILLed promoting it; the next one ends
    identical (the named checkpoint was never lost)."""
    root = tmp_path / "run"
    assert train(root, "--term-at-step", "7").returncode == 0
    killed = train(root, "--kill", kill)
    assert killed.returncode == -9, (killed.out, killed.err)
    assert killed.line("killing ") is not None
    ckpts = CheckpointDir(root)
    check_midway(root)
    assert [n.name for n in ckpts.named()] == ["interrupted"] or 1 in ckpts.steps()
    finish(root, reference)


def test_two_sigterms_in_one_epoch_replace_the_promoted_checkpoint(
    tmp_path: Path, reference: tuple[str, dict[str, Any]]
) -> None:
    """Interrupted at step 7, resumed, interrupted again at step 9 (same epoch): the second
    promotion replaces the first; the end is identical."""
    root = tmp_path / "run"
    assert train(root, "--term-at-step", "7").returncode == 0
    again = train(root, "--term-at-step", "2")
    assert again.returncode == 0, again.err
    assert again.line("interrupted at epoch 1 step 4") is not None, again.out
    run = finish(root, reference)
    assert run.line("resumed from 1: epoch 1 step 4") is not None, run.out


def test_a_legacy_root_is_refused_without_fresh(
    tmp_path: Path, reference: tuple[str, dict[str, Any]]
) -> None:
    """Epoch dirs written before atomic_ckpt (no marker): the trainer refuses to start
    (exit 2, naming mark-complete and --fresh) and touches nothing; --fresh starts over."""
    root = tmp_path / "run"
    legacy = {"0": {"model.bin": b"old epoch 0"}, "1": {"model.bin": b"old epoch 1"}}
    for name, files in legacy.items():
        write(root / name, files)
    refused = train(root)
    assert refused.returncode == 2, (refused.out, refused.err)
    assert "mark-complete" in refused.err
    assert "--fresh" in refused.err
    assert sorted(os.listdir(root)) == ["0", "1"]
    assert {n: contents(root / n) for n in legacy} == legacy
    fresh = train(root, trainer_args=("--fresh",))
    assert fresh.returncode == 0, fresh.err
    assert fresh.line("done ") == reference[0]


def test_a_restart_killed_while_a_promotion_replaces_a_step_resumes_bit_identical(
    tmp_path: Path, reference: tuple[str, dict[str, Any]]
) -> None:
    """Interrupted twice in epoch 1, so the second promotion replaces step 1; SIGKILL right
    after its exchange: the restart ends identical, with no stale `interrupted` left."""
    root = tmp_path / "run"
    assert train(root, "--term-at-step", "7").returncode == 0
    assert train(root, "--term-at-step", "2").returncode == 0
    killed = train(root, "--kill", rf"rename_exchange:{PROMOTED}$:1:after")
    assert killed.returncode == -9, (killed.out, killed.err)
    assert killed.line("killing ") is not None
    check_midway(root)
    named = CheckpointDir(root).named()
    assert all(n.manifest.metadata["global_step"] == 9 for n in named), (
        "the name 'interrupted' holds another save: "
        f"{[(n.name, n.manifest.metadata) for n in named]}"
    )
    finish(root, reference)
