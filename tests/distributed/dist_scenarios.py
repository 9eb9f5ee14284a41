"""What each rank does in the distributed tests; runs in a child process (see conftest).

Each scenario is ``fn(ctx) -> data`` (JSON-serializable); ``main`` sets up the
gloo process group, runs it, and writes ``{"error", "message", "elapsed",
"data"}`` to ``<out>/rank<r>.json``.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ranks import Ctx, run_scenario

from atomic_ckpt import DistributedCommitError, RetentionPolicy
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt.distributed import distributed_commit, load_dcp, rank0_commit, rank_path, resume

TIMEOUT = 4.0
"""The commit timeout of the failure scenarios: short, to keep the suite fast."""


SCENARIOS: dict[str, Callable[[Ctx], Any]] = {}


def scenario(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], Any]:
    SCENARIOS[fn.__name__] = fn
    return fn


def main(
    name: str, rank: int, world: int, paths: tuple[str, str, str], params: dict[str, Any]
) -> None:
    """Run scenario ``name`` as ``rank`` (see tests/ranks.py)."""
    run_scenario(name, rank, world, paths, params, scenarios=SCENARIOS)


def payload(rank: int, step: int, size: int = 1000) -> bytes:
    return bytes([(rank * 31 + step) % 251]) * size


def write_shard(ctx: Ctx, path: Path, step: int) -> None:
    rank_path(path / "shard.bin").write_bytes(payload(ctx.rank, step))


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@scenario
def commit(ctx: Ctx) -> Any:
    step = ctx.params.get("step", 1)
    with distributed_commit(ctx.ckpts, step, metadata={"loss": 0.5}) as path:
        write_shard(ctx, path, step)
        (path / f"sub{ctx.rank}").mkdir()
        (path / f"sub{ctx.rank}" / "extra.bin").write_bytes(payload(ctx.rank, step, 10))
        staging = path.name
    # After the commit every rank sees it (a barrier followed the promotion).
    got = ctx.ckpts.get(step)
    return {"staging": staging, "visible": got.path.name}


@scenario
def replace(ctx: Ctx) -> Any:
    for round_ in range(2):
        with distributed_commit(ctx.ckpts, 5, metadata={"round": round_}) as path:
            rank_path(path / "shard.bin").write_bytes(payload(ctx.rank, round_))
    return None


@scenario
def rank_raises(ctx: Ctx) -> Any:
    victim = ctx.params["victim"]
    with distributed_commit(ctx.ckpts, 2, timeout=TIMEOUT) as path:
        write_shard(ctx, path, 2)
        if ctx.rank == victim:
            raise ValueError(f"disk full on purpose (rank {ctx.rank})")
    return None


@scenario
def rank_killed(ctx: Ctx) -> Any:
    victim = ctx.params["victim"]
    with distributed_commit(ctx.ckpts, 2, timeout=TIMEOUT) as path:
        if ctx.rank == victim:
            rank_path(path / "shard.bin").write_bytes(b"half a shard")
            (ctx.out / "killed").write_text(path.name)
            kill_self()
        write_shard(ctx, path, 2)
    return None


@scenario
def rank_hangs(ctx: Ctx) -> Any:
    victim = ctx.params["victim"]
    with distributed_commit(ctx.ckpts, 2, timeout=TIMEOUT) as path:
        write_shard(ctx, path, 2)
        if ctx.rank == victim:
            time.sleep(3 * TIMEOUT)
    return None


@scenario
def rank0_killed_before_rename(ctx: Ctx) -> Any:
    if ctx.rank == 0:

        def die(src: Path, dst: Path) -> None:
            # The marker must already be in place: record it, then die.
            (ctx.out / "fired").write_text(
                json.dumps([src.name, (src / "checkpoint_complete").is_file()])
            )
            kill_self()

        _fs.rename_noreplace = die  # type: ignore[assignment]
        _fs.rename_exchange = die  # type: ignore[assignment]
    with distributed_commit(ctx.ckpts, ctx.params["step"], timeout=TIMEOUT) as path:
        write_shard(ctx, path, 3)
    return None


@scenario
def resume_agreement(ctx: Ctx) -> Any:
    for step in (1, 2, 3):
        with distributed_commit(ctx.ckpts, step) as path:
            write_shard(ctx, path, step)
    if ctx.rank == 0 and ctx.params.get("corrupt_latest"):
        victim = ctx.ckpts.path_of(3) / "shard.rank1.bin"
        victim.write_bytes(b"x" * len(victim.read_bytes()))
    if ctx.rank != 0:
        # Ranks other than 0 must never scan: make it fail loudly if they do.
        def no_scan(*_a: Any, **_k: Any) -> Any:
            raise AssertionError("a rank other than 0 scanned the root")

        ctx.ckpts.checkpoints = no_scan  # type: ignore[method-assign]
        ctx.ckpts.latest = no_scan  # type: ignore[method-assign]
        # A newer complete checkpoint only this rank could see must not matter.
    ckpt = resume(ctx.ckpts, verify=bool(ctx.params.get("corrupt_latest")))
    assert ckpt is not None
    mine = rank_path(ckpt.path / "shard.bin").read_bytes()
    return {"step": ckpt.step, "own_shard_ok": mine == payload(ctx.rank, ckpt.step)}


@scenario
def resume_empty(ctx: Ctx) -> Any:
    return {"none": resume(ctx.ckpts) is None}


@scenario
def dcp_roundtrip(ctx: Ctx) -> Any:
    import torch.distributed.checkpoint as dcp

    gen = torch.Generator().manual_seed(1234)
    shared = torch.randn(64, 8, generator=gen)  # identical on every rank: replicated
    own = torch.randn(100, generator=torch.Generator().manual_seed(ctx.rank)) * 1e-3
    # A key on every rank is replicated (written once); own<r> exists on rank r only.
    state = {"shared": shared.clone(), f"own{ctx.rank}": own.clone(), "half": shared.half()}
    with distributed_commit(ctx.ckpts, 7) as path:
        dcp.save(state, checkpoint_id=path)
    ckpt = resume(ctx.ckpts)
    assert ckpt is not None
    assert ckpt.step == 7
    target = {
        "shared": torch.zeros_like(shared),
        f"own{ctx.rank}": torch.zeros_like(own),
        "half": torch.zeros_like(shared.half()),
    }
    load_dcp(target, ckpt)
    exact = (
        torch.equal(target["shared"], shared)
        and torch.equal(target[f"own{ctx.rank}"], own)
        and torch.equal(target["half"], shared.half())
    )
    return {"exact": exact, "files": sorted(e.path for e in ckpt.manifest.files)}


@scenario
def retain(ctx: Ctx) -> Any:
    if ctx.rank != 0:

        def no_delete(*_a: Any, **_k: Any) -> Any:
            raise AssertionError("a rank other than 0 deleted a checkpoint")

        ctx.ckpts._delete = no_delete  # type: ignore[method-assign]
    policy = RetentionPolicy(keep_last=2, metric="loss")
    losses = {1: 0.9, 2: 0.1, 3: 0.5, 4: 0.7, 5: 0.6}
    for step, loss in losses.items():
        with distributed_commit(ctx.ckpts, step, metadata={"loss": loss}, retain=policy) as path:
            write_shard(ctx, path, step)
    return None


ENTRY_TIMEOUT = 3.0
"""The entry check's timeout in the collective-misuse scenarios."""


@scenario
def commit_on_rank0_only(ctx: Ctx) -> Any:
    """The misuse of issue 14: a "rank 0 saves, then everyone meets at a barrier" save
    calling the collective commit. ``warm``: one correct commit first (so the
    coordination group exists); ``then_collective``: a correct commit afterwards."""
    if ctx.params.get("warm"):
        with distributed_commit(ctx.ckpts, 1, entry_timeout=ENTRY_TIMEOUT) as path:
            write_shard(ctx, path, 1)
    seen: dict[str, Any] = {"error": None, "message": "", "elapsed": 0.0}
    if ctx.rank == 0:
        start = time.monotonic()
        try:
            with distributed_commit(ctx.ckpts, 2, entry_timeout=ENTRY_TIMEOUT) as path:
                write_shard(ctx, path, 2)
        except DistributedCommitError as exc:
            seen.update(error=type(exc).__name__, message=str(exc))
        seen["elapsed"] = time.monotonic() - start
    dist.barrier()  # where the other ranks waited all along
    if ctx.params.get("then_collective"):
        with distributed_commit(ctx.ckpts, 3, entry_timeout=ENTRY_TIMEOUT) as path:
            write_shard(ctx, path, 3)
        seen["steps"] = ctx.ckpts.steps() if ctx.rank == 0 else None
    return seen


@scenario
def resume_unmarked(ctx: Ctx) -> Any:
    """resume() on a root of unusable (unmarked, unreadable) step dirs only (the test made
    them), then fresh=True."""
    seen: dict[str, Any] = {}
    try:
        resume(ctx.ckpts)
        seen["plain"] = None
    except Exception as exc:
        seen["plain"] = type(exc).__name__
        seen["message"] = str(exc)
        seen["paths"] = sorted(Path(p).name for p in getattr(exc, "paths", ()))
    seen["fresh"] = resume(ctx.ckpts, fresh=True) is None
    return seen


def count_fsyncs() -> dict[str, int]:
    """Count this process's fsyncs from now on, by wrapping the syscall module's
    ``fsync_fd`` (every fsync of the library goes through it); returns the live counter."""
    counts = {"fsync": 0}
    real = _fs.fsync_fd

    def counted(fd: int) -> None:
        counts["fsync"] += 1
        real(fd)

    _fs.fsync_fd = counted  # type: ignore[assignment]
    return counts


@scenario
def fsync_count(ctx: Ctx) -> Any:
    """One commit of 2 files and 1 subdirectory per rank; how many fsyncs this rank made.
    ``declare``: the files are named with rank_path (the sub-file declared explicitly)."""
    counts = count_fsyncs()
    with distributed_commit(ctx.ckpts, 1) as path:
        write_shard(ctx, path, 1)
        sub = path / f"sub{ctx.rank}"
        sub.mkdir()
        (sub / "extra.bin").write_bytes(payload(ctx.rank, 1, 10))
        if ctx.params.get("declare"):
            from atomic_ckpt.distributed import declare

            declare(sub / "extra.bin")
    return counts


@scenario
def fsync_count_one_undeclared(ctx: Ctx) -> Any:
    """Every rank calls declare() (so it vouches for its files) for its shard, but also writes
    one file it does not declare; how many fsyncs this rank made."""
    from atomic_ckpt.distributed import declare

    counts = count_fsyncs()
    with distributed_commit(ctx.ckpts, 1) as path:
        write_shard(ctx, path, 1)
        declare(rank_path(path / "shard.bin"))
        (path / f"loose{ctx.rank}.bin").write_bytes(payload(ctx.rank, 1, 10))
    return counts


@scenario
def rank0_saves(ctx: Ctx) -> Any:
    """rank0_commit: rank 0 writes the model; every rank leaves after the commit is durable.
    ``die``: rank 0 is killed inside its block; ``fail``: rank 0's save raises."""
    seen: dict[str, Any] = {}
    start = time.monotonic()
    try:
        with rank0_commit(ctx.ckpts, 4, timeout=TIMEOUT, metadata={"by": "rank0"}) as path:
            seen["path"] = None if path is None else path.name
            if path is not None:
                (path / "model.bin").write_bytes(payload(0, 4))
                if ctx.params.get("die"):
                    (ctx.out / "killed").write_text(path.name)
                    kill_self()
                if ctx.params.get("fail"):
                    raise OSError("no space left on purpose")
        seen["steps"] = ctx.ckpts.steps()  # visible to every rank once the block is left
    except Exception as exc:
        seen.update(error=type(exc).__name__, message=str(exc))
    seen["elapsed"] = time.monotonic() - start
    return seen


@scenario
def rank0_saves_nested(ctx: Ctx) -> Any:
    """The seed trainer's saves on every rank: an epoch commit with its label, a
    ``save_checkpoint()`` inside it that joins (and would commit alone), then a named
    ``interrupted`` checkpoint; what every rank sees after each block."""

    def save_checkpoint(step: int) -> bool:
        """Writes the model; commits when called alone. True if it joined an open commit
        (judged on rank 0, which publishes; the other ranks' blocks yield None either way,
        and rank 0 may publish before they look)."""
        with rank0_commit(ctx.ckpts, step, join=True, timeout=TIMEOUT) as path:
            if path is not None:
                (path / "model.bin").write_bytes(payload(0, step))
            elif ctx.rank == 0:
                raise AssertionError("rank 0 got no directory")
        return ctx.rank != 0 or step not in ctx.ckpts.steps()  # joined: not published yet

    seen: dict[str, Any] = {}
    with rank0_commit(
        ctx.ckpts, 5, aliases=["epoch0_step5"], replace_aliases=True, timeout=TIMEOUT
    ) as path:
        seen["joined"] = save_checkpoint(5)
        if path is not None:
            (path / "trainer_state.json").write_text("{}")
    seen["steps"] = ctx.ckpts.steps()
    seen["aliases"] = sorted(ctx.ckpts.aliases(5))
    save_checkpoint(6)  # no open commit: it commits step 6 itself, every rank waiting
    seen["alone"] = 6 in ctx.ckpts.steps()
    with rank0_commit(ctx.ckpts, "interrupted", metadata={"epoch": 1}, timeout=TIMEOUT) as path:
        if path is not None:
            (path / "model.bin").write_bytes(payload(0, 7))
    seen["named"] = ctx.ckpts.get_named("interrupted").manifest.metadata
    return seen


@scenario
def rank0_join_swallowed(ctx: Ctx) -> Any:
    """Issue 30 items 1 and 5: an outer ``rank0_commit`` of step 9 writes the model; a
    block joined to it (``join=True``) writes half an optimizer file and raises OSError,
    on the ranks in ``params["raise_on"]``; the caller swallows that error. What each rank
    then sees: the error its outer block ended with, the steps, what was left."""
    from atomic_ckpt import CheckpointDir

    raise_on = ctx.params["raise_on"]
    fired: list[int] = []
    seen: dict[str, Any] = {"outer": None}
    try:
        with rank0_commit(ctx.ckpts, 9, timeout=TIMEOUT) as path:
            if path is not None:
                (path / "model.bin").write_bytes(payload(0, 9))
            try:
                with rank0_commit(ctx.ckpts, 9, join=True, timeout=TIMEOUT) as inner:
                    if inner is not None:
                        (inner / "optimizer.bin").write_bytes(b"half")
                    if ctx.rank in raise_on:
                        fired.append(ctx.rank)
                        if ctx.params.get("enospc"):
                            code = errno.ENOSPC
                            raise OSError(code, os.strerror(code), str(ctx.ckpts.root))
                        raise OSError("half written on purpose")
            except OSError as exc:
                seen["swallowed"] = f"{type(exc).__name__}: {exc}"  # the caller swallows it
    except Exception as exc:
        seen["outer"] = type(exc).__name__
        seen["message"] = str(exc)
    dist.barrier()  # every rank's outer block has ended: look at the root now
    fresh = CheckpointDir(ctx.ckpts.root)
    seen["fired"] = fired
    seen["steps"] = fresh.steps()
    seen["left"] = sorted(n for n in os.listdir(fresh.root) if ".tmp-" in n)
    return seen


@scenario
def commit_over_moved(ctx: Ctx) -> Any:
    """Issue 30 item 6: step 5 holds a complete checkpoint moved there by hand (``mv
    interrupted 5``, made on rank 0). ``rank0_commit`` and ``distributed_commit`` of step 5
    are refused on every rank; with ``replace_unusable=True`` each commits."""
    if ctx.rank == 0:
        with ctx.ckpts.commit_named("interrupted") as path:
            (path / "model.bin").write_bytes(b"interrupt save")
        os.rename(ctx.ckpts.root / "interrupted", ctx.ckpts.path_of(5))
    dist.barrier()
    seen: dict[str, Any] = {}
    for how in ("rank0_commit", "distributed_commit"):
        for replace in (False, True):
            try:
                if how == "rank0_commit":
                    with rank0_commit(
                        ctx.ckpts, 5, timeout=TIMEOUT, replace_unusable=replace
                    ) as path:
                        if path is not None:
                            (path / "model.bin").write_bytes(payload(0, 5))
                else:
                    with distributed_commit(
                        ctx.ckpts, 5, timeout=TIMEOUT, replace_unusable=replace
                    ) as path:
                        write_shard(ctx, path, 5)
                seen[f"{how} {replace}"] = "committed"
            except Exception as exc:
                seen[f"{how} {replace}"] = f"{type(exc).__name__}: {exc}"
            if how == "rank0_commit" and not replace:
                seen["kept"] = (ctx.ckpts.path_of(5) / "model.bin").read_bytes().decode()
            if how == "rank0_commit" and replace and ctx.rank == 0:
                # Moved by hand again, for distributed_commit's turn.
                with ctx.ckpts.commit_named("interrupted") as path:
                    (path / "model.bin").write_bytes(b"interrupt save")
                ctx.ckpts.delete(5)
                os.rename(ctx.ckpts.root / "interrupted", ctx.ckpts.path_of(5))
            dist.barrier()
    return seen


# ---------------------------------------------------------------- the verified resume

SHARED, UNREAD = "shared.bin", "unread.bin"


def shard(rank: int) -> str:
    return f"shard.rank{rank}.bin"


def commit_shards(ctx: Ctx, steps: tuple[int, ...] = (1, 2)) -> None:
    """Each step: every rank's shard; rank 0 also writes a shared file and one nobody reads."""
    from atomic_ckpt.distributed import declare

    for step in steps:
        with distributed_commit(ctx.ckpts, step) as path:
            write_shard(ctx, path, step)
            if ctx.rank == 0:
                for name in (SHARED, UNREAD):
                    (path / name).write_bytes(payload(7, step, 3000) + name.encode())
                    declare(path / name)


def damage(ctx: Ctx, step: int, name: str) -> bool:
    """On rank 0: flip a byte of ``name`` in ``step`` (same size); True once it is changed.
    Every rank waits for it (a barrier), so no rank resumes before the damage is done."""
    fired = False
    if ctx.rank == 0:
        target = ctx.ckpts.path_of(step) / name
        before = target.read_bytes()
        target.write_bytes(before[:-1] + bytes([before[-1] ^ 0xFF]))
        fired = target.read_bytes() != before and len(target.read_bytes()) == len(before)
    dist.barrier()
    return fired


def count_hashing() -> dict[str, int]:
    """The bytes this process's verify hashes from now on, by checkpoint-relative path
    (both ways verify reads a file: plainly hashed, or mapped to be kept)."""
    from atomic_ckpt._core.l3_formats import verify as _verify

    counts: dict[str, int] = {}
    real_hash, real_map = _verify.checksum_file, _verify.map_file

    def counter(path: str) -> Callable[[int], None]:
        rel = Path(path).name  # (the files of these scenarios are top-level)

        def add(n: int) -> None:
            counts[rel] = counts.get(rel, 0) + n

        return add

    def checksum_file(path: str, algorithm: str, **kw: Any) -> str:
        kw.pop("on_read", None)
        return real_hash(path, algorithm, on_read=counter(path), **kw)

    def map_file(path: str, algorithm: str | None, **kw: Any) -> Any:
        kw.pop("on_read", None)
        return real_map(path, algorithm, on_read=counter(path), **kw)

    _verify.checksum_file = checksum_file  # type: ignore[assignment]
    _verify.map_file = map_file  # type: ignore[assignment]
    return counts


class Warnings(logging.Handler):
    """The warnings this process logs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        logging.getLogger("atomic_ckpt").addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@scenario
def verified_resume(ctx: Ctx) -> Any:
    """Two steps committed; ``damage``: [step, name] pairs rank 0 damages first; ``reads``:
    each rank's ``read`` (default: its own shard and the shared file); ``fresh``. Returns
    what this rank got, which of its views match the files, and what it hashed."""
    from atomic_ckpt.distributed import resume_verified

    commit_shards(ctx)
    fired = [damage(ctx, step, name) for step, name in ctx.params.get("damage", [])]
    reads = ctx.params.get("reads") or [[shard(r), SHARED] for r in range(ctx.world)]
    warned = Warnings()
    hashed = count_hashing()
    seen: dict[str, Any] = {"fired": fired, "error": None}
    try:
        found = resume_verified(
            ctx.ckpts, reads[ctx.rank], timeout=TIMEOUT, fresh=ctx.params.get("fresh", False)
        )
    except Exception as exc:
        seen.update(error=type(exc).__name__, message=str(exc))
        found = None
    seen["step"] = None if found is None else found.checkpoint.step
    if found is not None:
        seen["views"] = sorted(found.files)
        seen["exact"] = all(
            bytes(data) == (found.checkpoint.path / rel).read_bytes()
            for rel, data in found.files.items()
        )
        seen["total"] = found.checkpoint.manifest.total_size
    seen["hashed"] = hashed
    seen["warnings"] = warned.messages
    return seen


@scenario
def verified_resume_rank_fails(ctx: Ctx) -> Any:
    """Rank ``victim``'s part of the verify dies (``how="kill"``) or raises something other
    than a failed verify (``how="raise"``); what each surviving rank raised, how fast."""
    from atomic_ckpt._core.l3_formats import verify as _verify
    from atomic_ckpt.distributed import resume_verified

    commit_shards(ctx, steps=(1,))
    if ctx.rank == ctx.params["victim"]:

        def failing(*_a: Any, **_k: Any) -> Any:
            (ctx.out / f"fired{ctx.rank}").write_text("verify")
            if ctx.params["how"] == "kill":
                kill_self()
            raise MemoryError("cannot map the shard on purpose")

        _verify.verify = failing  # type: ignore[assignment]
    seen: dict[str, Any] = {"error": None}
    start = time.monotonic()
    try:
        resume_verified(ctx.ckpts, [shard(ctx.rank)], timeout=TIMEOUT)
    except Exception as exc:
        seen.update(error=type(exc).__name__, message=str(exc))
    seen["elapsed"] = time.monotonic() - start
    return seen
