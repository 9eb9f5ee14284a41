"""Power-loss simulation: check a save function against every state a crash could leave.

In the style of ALICE, CrashMonkey and LazyFS: run the save once on a scratch
directory while recording every filesystem operation it makes, then rebuild,
at every operation boundary, the states a power loss could leave on disk, and
run the real scanner and loader on each.

What is recorded:

* the library's own operations, by hooking :mod:`atomic_ckpt._core.l2_syscalls.fs` (the one
  module that makes the durability syscalls): fsyncs, renames, the marker
  write, tree removal;
* everything else (the files the save function wrote, ``mkdir`` of the
  staging directory, ``rmdir``): found by comparing the real tree with the
  model before each hooked operation. These are unsynced writes: a save
  function's own fsyncs are not seen, so its files count as volatile until the
  library fsyncs them (the conservative reading).

The model keeps, per inode, file data or directory entries. An fsync of a file
makes its data durable; an fsync of a directory makes its entries durable; a
rename is durable once its parent directory is fsynced. Three crash models:

``strict``
    Everything not fsynced is lost.
``ext4``
    Like ext4's ordered journal: every metadata operation before the last
    fsync survives (an fsync commits the journal, so an fsynced file survives
    with its entry), later ones survive as a prefix; file data written but not
    fsynced is lost, present, zero-filled at full length, or torn (truncated).
``subset``
    Any subset of the operations not yet covered by an fsync survives, in any
    combination (all of them, each one alone, all but one, and random subsets).

Not modelled: the order of the save function's own writes between two hooked
operations (they are logged in path order; only the ``ext4`` prefix depends on
it), renames it makes itself (they look like a delete and a create), its own
fsyncs, hard links, partial overwrites inside a file (a file's contents change
as a whole), and file metadata (modes, times, xattrs). Symlinks are created
whole. Every file version is kept in memory: simulate with a small model.

To audit a program that does not save through the library (any framework, or none),
see :func:`audit` (``atomic-ckpt audit``): the same crash model, fed by an ``strace``
recording of the program instead of these hooks.

Typical use, on your own save function::

    from atomic_ckpt.testing import check_invariants, explore

    def save(ckpts):
        with ckpts.commit(1) as path:
            model.save_pretrained(path)

    report = explore(save)
    assert report.ok, report

``explore`` passes ``save`` a :class:`~atomic_ckpt.CheckpointDir` on a scratch
root; the checker gets a :class:`CrashState` (a rebuilt root on disk, what
each step may hold at that moment, and a description of which operations
survived) and raises ``AssertionError`` to reject it.
"""

from __future__ import annotations

from atomic_ckpt._core.l1_names import public as _public

# One job per module, from the ground up: _results (the data types), _mirror (the
# model of the live scratch tree), _recorder (the hooks that log each operation),
# _states (the crash models and the states they allow), invariants (I1 to I4),
# mutants (protocol mutants), _crash (record a save, check every crash state).
from atomic_ckpt.testing._crash import Recording, Replace, explore, record
from atomic_ckpt.testing._recorder import read_tree
from atomic_ckpt.testing._results import (
    MODELS,
    Checker,
    CrashState,
    Expectation,
    Failure,
    InvariantViolation,
    Op,
    Report,
    Tree,
    Version,
)
from atomic_ckpt.testing._results import (
    DataFate as DataFate,  # importable as before, outside __all__
)
from atomic_ckpt.testing._results import Model as Model
from atomic_ckpt.testing.audit import AuditReport, audit
from atomic_ckpt.testing.invariants import check_invariants
from atomic_ckpt.testing.mutants import STEPS, mutant

__all__ = [
    "MODELS",
    "STEPS",
    "AuditReport",
    "Checker",
    "CrashState",
    "Expectation",
    "Failure",
    "InvariantViolation",
    "Op",
    "Recording",
    "Replace",
    "Report",
    "Tree",
    "Version",
    "audit",
    "check_invariants",
    "explore",
    "mutant",
    "read_tree",
    "record",
]

_public.export(__name__, globals(), __all__)
