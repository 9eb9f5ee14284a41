"""Multi-rank commit and resume over ``torch.distributed`` (PROTOCOL.md, "Several ranks").

::

    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.distributed import distributed_commit, rank_path, resume, resume_verified

    ckpts = CheckpointDir("/shared/run1")
    with distributed_commit(ckpts, step) as path:     # on every rank
        torch.save(shard, rank_path(path / "model.pt"))  # model.rank<r>.pt, declared
        if rank == 0:
            save_config(path / "config.json")
            declare(path / "config.json")              # flushed by rank 0 alone
    ckpt = resume(ckpts)                               # the same on every rank
    found = resume_verified(ckpts, [mine])             # verified, each byte read once

    with rank0_commit(ckpts, step) as path:           # a save rank 0 alone writes
        if path is not None:                            # rank 0; the others wait
            save_model(path)

Every function here also runs without a process group (one process is rank 0), so a
script that trains on one process or many needs no ``dist.is_initialized()`` branches.

A commit, on every rank of the group, in order:

1. rank 0 takes its staging lock, creates ``N.tmp-<uuid>/`` and broadcasts the
   name (or why it could not);
2. every rank writes its files into it (the ``with`` body);
3. the ranks exchange their outcomes (this is the barrier after the writes);
   if any rank raised, every rank raises and rank 0 removes the staging dir;
4. every rank fsyncs and hashes the files it *declared*: those it named with
   :func:`rank_path` (its own rank's names) or passed to :func:`declare` (a
   declared directory stands for its whole subtree), so each file is flushed
   once, by the rank that wrote it and whose page cache holds it; the ranks
   exchange these entries and outcomes;
5. the fallback sweep, for what no rank declared: every rank lists the staging
   tree (a listing and a stat per entry, no data read) and checks that every
   declared file is there with the size its writer recorded; an undeclared file
   is fsynced by rank 0 and by every rank that did not call :func:`declare` (it
   may have written it: on a network filesystem only the writer's fsync flushes
   it; a rank that calls :func:`declare` vouches for declaring all it wrote), the
   undeclared files are split among the ranks for hashing, and rank 0 fsyncs the
   subdirectories; the ranks exchange their listings, hashes and outcomes, and a
   listing that differs from rank 0's is an error (the shared filesystem does not
   show every rank the same directory). When every file is declared, a commit
   makes one fsync per file, one per directory and a constant few, whatever the
   number of ranks;
6. rank 0 alone writes the marker (a manifest of every rank's files), fsyncs
   the staging dir, promotes under the root lock, fsyncs the root and, with
   ``retain=``, applies the retention policy;
7. rank 0 broadcasts the outcome: no rank leaves the ``with`` block before the
   checkpoint is durable (this broadcast is the closing barrier), and if rank 0
   failed every rank raises.

The collectives run on a gloo group of the same ranks made for this purpose
with ``timeout``: a rank that crashes or hangs makes the others raise
:class:`~atomic_ckpt.DistributedCommitError` (a lost connection is usually
noticed at once, a hung rank after ``timeout`` seconds) instead of waiting
forever. Rank 0 promotes only after every rank reported success, so a rank
lost before that means nothing was promoted; ``clean()`` removes a staging
directory that a crashed rank 0 left behind.

With its helpers ``_ranks`` (the collectives), ``_flush`` (steps 4 and 5:
which rank flushes which file) and ``_resume`` (the verified resume split among
ranks: :func:`resume_verified`), this is the only part of ``atomic_ckpt`` that
imports torch.distributed.
"""

import logging

from atomic_ckpt._core.l1_names import public as _public
from atomic_ckpt.distributed import _commit
from atomic_ckpt.distributed._commit import declare, distributed_commit, rank0_commit, rank_path
from atomic_ckpt.distributed._resume import load_dcp, resume, resume_verified

__all__ = [
    "DEFAULT_ENTRY_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "declare",
    "distributed_commit",
    "load_dcp",
    "rank0_commit",
    "rank_path",
    "resume",
    "resume_verified",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT = _commit.DEFAULT_TIMEOUT
"""Seconds a rank waits for the others at each step of a commit (as torch's default)."""
DEFAULT_ENTRY_TIMEOUT = _commit.DEFAULT_ENTRY_TIMEOUT
"""Seconds every rank waits for all to enter a commit before it names the missing ones."""

_public.export(__name__, globals(), __all__)
