"""What each rank does in the DCP tests; runs in a child process (see conftest).

Each scenario is ``fn(ctx) -> data`` (JSON-serializable); ``main`` sets up the
gloo process group, runs it, and writes ``{"error", "message", "elapsed",
"data"}`` to ``<out>/rank<r>.json``. DCP reports failures as a
``CheckpointException``, a ``BaseException``: ``main`` records those too.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from ranks import Ctx, run_scenario
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt.dcp import AtomicWriter, PendingSaveError, async_save, save
from atomic_ckpt.dcp._files import _CreatedFiles
from atomic_ckpt.distributed import resume

TIMEOUT = 4.0
"""atomic_ckpt's timeout in the failure scenarios: short, to keep the suite fast."""
PG_TIMEOUT = 10.0
"""The default group's timeout there: bounds DCP's own collectives after a rank died."""


SCENARIOS: dict[str, Callable[[Ctx], Any]] = {}


def scenario(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


def main(
    name: str, rank: int, world: int, paths: tuple[str, str, str], params: dict[str, Any]
) -> None:
    """Run scenario ``name`` as ``rank`` (see tests/ranks.py); DCP's CheckpointException,
    a BaseException, is reported too, with each failed rank's error type as data."""
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    run_scenario(
        name,
        rank,
        world,
        paths,
        params,
        scenarios=SCENARIOS,
        catch=BaseException,
        pg_timeout=params.get("pg_timeout", 30.0),
        data_of_error=_failed_ranks,
    )


def _failed_ranks(exc: BaseException) -> dict[str, str] | None:
    if not isinstance(exc, CheckpointException):
        return None
    return {
        str(r): type(f[0] if isinstance(f, tuple) else f).__name__ for r, f in exc.failures.items()
    }


def state_for(rank: int, seed: int) -> dict[str, torch.Tensor]:
    """A replicated tensor (written once, by one rank), one of this rank's own, a scalar."""
    shared = torch.randn(32, 16, generator=torch.Generator().manual_seed(seed))
    own = torch.randn(64, generator=torch.Generator().manual_seed(seed * 100 + rank))
    return {"shared": shared, f"own{rank}": own, "seed": torch.tensor(seed)}


def loads_exactly(path: Path, rank: int, seed: int) -> bool:
    """Plain dcp.load of ``path`` gives back ``state_for(rank, seed)`` bit for bit."""
    expected = state_for(rank, seed)
    target = {k: torch.zeros_like(v) for k, v in expected.items()}
    dcp.load(target, checkpoint_id=path)
    return all(torch.equal(target[k], v) for k, v in expected.items())


def count_fsyncs() -> dict[str, int]:
    """Count this process's fsyncs from now on (every one goes through _fs.fsync_fd)."""
    counts = {"fsync": 0}
    real = _fs.fsync_fd

    def counted(fd: int) -> None:
        counts["fsync"] += 1
        real(fd)

    _fs.fsync_fd = counted  # type: ignore[assignment]
    return counts


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def save_with(ctx: Ctx, api: str, state: dict[str, Any], step: int, **options: Any) -> None:
    """Save through one of the four ways a user can."""
    if api == "plain":
        dcp.save(state, storage_writer=AtomicWriter(ctx.ckpts, step, **options))
    elif api == "plain_async":
        future = dcp.async_save(state, storage_writer=AtomicWriter(ctx.ckpts, step, **options))
        assert not isinstance(future, dcp.state_dict_saver.AsyncSaveResponse)
        future.result()
    elif api == "wrapper":
        save(state, ctx.ckpts, step, **options)
    elif api == "wrapper_async":
        async_save(state, ctx.ckpts, step, **options).result()
    else:
        raise ValueError(api)


@scenario
def save_load(ctx: Ctx) -> Any:
    """Save step 1 (``api``), count this rank's fsyncs, resume() and load it back."""
    step = 1
    counts = count_fsyncs()
    save_with(
        ctx,
        ctx.params["api"],
        state_for(ctx.rank, step),
        step,
        metadata={"loss": 0.5},
        thread_count=ctx.params.get("threads", 1),
    )
    fsyncs = counts["fsync"]
    ckpt = resume(ctx.ckpts)
    assert ckpt is not None
    return {"fsync": fsyncs, "step": ckpt.step, "exact": loads_exactly(ckpt.path, ctx.rank, step)}


@scenario
def resave(ctx: Ctx) -> Any:
    """Save step 3 twice with different contents: the second replaces the first whole."""
    for seed in (1, 2):
        save_with(ctx, "plain", state_for(ctx.rank, seed), 3, metadata={"seed": seed})
    ckpt = resume(ctx.ckpts)
    assert ckpt is not None
    return {"step": ckpt.step, "exact": loads_exactly(ckpt.path, ctx.rank, 2)}


@scenario
def rank_raises(ctx: Ctx) -> Any:
    """The victim's shard write fails (after writing its files) in ``api``."""
    if ctx.rank == ctx.params["victim"]:
        real = FileSystemWriter.write_data

        def failing(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
            real(self, plan, planner)
            (ctx.out / "fired").write_text(str(self.path))
            raise OSError(28, "disk full on purpose")

        FileSystemWriter.write_data = failing  # type: ignore[method-assign]
    save_with(ctx, ctx.params["api"], state_for(ctx.rank, 2), 2, timeout=TIMEOUT)
    return None


@scenario
def async_failure_unread(ctx: Ctx) -> Any:
    """The victim's shard write fails in ``async_save``; the script waits for the future
    but never reads it: what the library logged meanwhile, on each rank."""
    import concurrent.futures
    import logging

    if ctx.rank == ctx.params["victim"]:

        def failing(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
            (ctx.out / "fired").write_text(str(self.path))
            raise OSError(28, "disk full on purpose")

        FileSystemWriter.write_data = failing  # type: ignore[method-assign]
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("atomic_ckpt.dcp").addHandler(handler)
    future = async_save(state_for(ctx.rank, 2), ctx.ckpts, 2, timeout=TIMEOUT)
    concurrent.futures.wait([future])
    return {"logged": records, "failed": future.exception() is not None}


@contextlib.contextmanager
def _dying_stream(self: _CreatedFiles, path: Any, mode: str) -> Iterator[Any]:
    """Open the shard, write half of something, then SIGKILL this process."""
    with open(path, mode) as stream:
        stream.write(b"half a shard")
        stream.flush()
        _OUT[0].joinpath("killed").write_text(Path(path).parent.name)
        kill_self()
        yield stream


_OUT: list[Path] = []


@scenario
def rank_killed(ctx: Ctx) -> Any:
    """The victim is SIGKILLed in the middle of writing its shard."""
    if ctx.rank == ctx.params["victim"]:
        _OUT.append(ctx.out)
        _CreatedFiles.create_stream = _dying_stream  # type: ignore[method-assign,assignment]
    save_with(ctx, ctx.params.get("api", "wrapper"), state_for(ctx.rank, 2), 2, timeout=TIMEOUT)
    return None


@scenario
def coordinator_killed_before_promotion(ctx: Ctx) -> Any:
    """Rank 0 dies after every rank wrote and the marker is in place, before the rename."""
    if ctx.rank == 0:

        def die(src: Path, dst: Path) -> None:
            (ctx.out / "fired").write_text(
                json.dumps([src.name, (src / "checkpoint_complete").is_file()])
            )
            kill_self()

        _fs.rename_noreplace = die  # type: ignore[assignment]
        _fs.rename_exchange = die  # type: ignore[assignment]
    save_with(ctx, "wrapper", state_for(ctx.rank, 3), ctx.params["step"], timeout=TIMEOUT)
    return None


@scenario
def pending(ctx: Ctx) -> Any:
    """A slow async save of step 1, then a writer of step 2 made with ``on_pending``."""
    real = FileSystemWriter.write_data
    calls: list[int] = []

    def slow(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:  # the first save only
            time.sleep(ctx.params["slow"])
        return real(self, plan, planner)

    FileSystemWriter.write_data = slow  # type: ignore[method-assign]
    first = dcp.async_save(state_for(ctx.rank, 1), storage_writer=AtomicWriter(ctx.ckpts, 1))
    assert not isinstance(first, dcp.state_dict_saver.AsyncSaveResponse)
    seen: dict[str, Any] = {"error": None}
    seen["first_done_at_start"] = first.done()
    try:
        second = AtomicWriter(ctx.ckpts, 2, on_pending=ctx.params["on_pending"])
        seen["first_done_before_second"] = first.done()
        dcp.async_save(state_for(ctx.rank, 2), storage_writer=second).result()
    except PendingSaveError as exc:
        seen["error"] = type(exc).__name__
        seen["first_done_before_second"] = first.done()
    first.result()
    ckpt = resume(ctx.ckpts)
    assert ckpt is not None
    seen["latest"] = ckpt.step
    seen["exact"] = loads_exactly(ckpt.path, ctx.rank, ckpt.step)
    return seen
