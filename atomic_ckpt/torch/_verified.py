"""What a verified load may read: only a file's bytes that were hashed, never a file by its
path, never through a symlink; the pickles and the JSON copied and hashed again before
they are parsed.

A :class:`~atomic_ckpt.VerifiedCheckpoint` holds the mappings its verify hashed. Those are
``MAP_PRIVATE`` mappings of the files, not snapshots: a file replaced after the verify (by
rename, as every commit replaces a step) leaves them holding the bytes that were hashed,
but bytes written into the same file in place would show through. So the pickles and the
JSON (parsed into objects, not copied into a model) are copied into private memory and
hashed once more against the manifest; a difference is a VerificationError. The model's
safetensors are copied from the mapping into the model's tensors directly (a second hash
of gigabytes would double the cost of the verify); the library never writes into a
committed file in place, and ``docs/guides/guarantees.md`` says what that leaves open.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection
from pathlib import Path
from typing import NoReturn

from atomic_ckpt import VerificationError, VerifiedCheckpoint
from atomic_ckpt._core.l2_syscalls.checksums import new_hasher

_OPEN = (
    os.O_RDONLY
    | os.O_NONBLOCK  # a FIFO put in a file's place reads as empty, never blocks
    | getattr(os, "O_NOFOLLOW", 0)  # a link is refused, never followed
    | getattr(os, "O_CLOEXEC", 0)
)

Digest = tuple[int, str | None, str | None]
"""What was read of a file: its size, the checksum algorithm and its digest (None: none)."""


def require(verified: VerifiedCheckpoint, names: Collection[str]) -> None:
    """Raise unless ``verified`` kept the hashed bytes of every file of ``names``: a verified
    load never falls back to reading a path. Why not, by what the manifest records there:
    a symlink (never followed: its target was never hashed) or no file at all is a
    VerificationError (an OSError) naming it, a regular file that was not kept a
    ValueError (the caller did not ask ``resume_verified`` for it)."""
    ckpt = verified.checkpoint
    lacking = [n for n in names if n not in verified.files]
    if not lacking:
        return
    if ckpt.manifest.legacy:
        _refuse(
            verified,
            ckpt.path,
            "a verified load cannot read it: its marker records no files (a legacy, empty "
            f"marker), so none of {', '.join(lacking)} was verified. Load it with "
            "verify=False, or save it again",
        )
    entries = {e.path: e for e in ckpt.manifest.files}
    for name in lacking:
        entry = entries.get(name)
        if entry is not None and entry.type == "symlink":
            _refuse(
                verified,
                ckpt.path / name,
                f"a verified load cannot read it: it is a symlink (to {entry.target!r}) "
                "inside the checkpoint, and a verified load never follows a link, whose "
                "target's bytes were never hashed. Put the file itself in the checkpoint, "
                "or load it with verify=False",
            )
        if entry is None or entry.type != "file":
            raise FileNotFoundError(
                f"the verified checkpoint {ckpt.path} has no file {name}, which the load "
                "needs: pass only the objects it holds the state of"
            )
    raise ValueError(
        f"the verified checkpoint {ckpt.path} kept no verified bytes of {', '.join(lacking)}: "
        "a verified load reads only what it hashed. Pass those files (or STATE_FILES) "
        "to resume_verified(), or load the Checkpoint unverified"
    )


def copy(verified: VerifiedCheckpoint, name: str) -> bytes:
    """``name``'s verified bytes, copied into private memory and hashed again against the
    manifest (see the module's docstring): VerificationError if they changed since."""
    require(verified, [name])
    data = bytes(verified.files[name])
    if not matches(verified, name, digest_of(data, verified.checkpoint.manifest.checksum)):
        _refuse(
            verified,
            verified.checkpoint.path / name,
            "it changed since it was verified (written in place): not loaded. Resume "
            "again, and let nothing write into a committed file",
        )
    return data


def copied(verified: VerifiedCheckpoint, name: str) -> tuple[bytes, Digest]:
    """:func:`copy`, as :func:`read_file` returns (the digest already compared: none)."""
    return copy(verified, name), (0, None, None)


def digest_of(data: bytes, algorithm: str | None) -> Digest:
    """The :data:`Digest` of ``data`` (no digest where the algorithm is not built in)."""
    try:
        hasher = None if algorithm is None else new_hasher(algorithm)
    except ValueError:  # an algorithm registered for fds only: the size is the check
        hasher = None
    if hasher is None:
        return len(data), None, None
    hasher.update(memoryview(data))
    return len(data), algorithm, hasher.hexdigest()


def matches(verified: VerifiedCheckpoint, name: str, digest: Digest) -> bool:
    """Whether ``digest`` is the size and checksum the verified manifest records for
    ``name`` (no checksum recorded or computed: the size alone)."""
    entry = next((e for e in verified.checkpoint.manifest.files if e.path == name), None)
    if entry is None or entry.type != "file" or entry.size != digest[0]:
        return False
    algorithm = verified.checkpoint.manifest.checksum
    if entry.checksum is None or algorithm is None:
        return True
    return digest[1] == algorithm and digest[2] == entry.checksum


def read_file(path: Path, algorithm: str | None) -> tuple[bytes, Digest]:
    """The bytes of the regular file ``path`` (never through a symlink) and their digest:
    what an early read of a verified resume deserializes, if the verify then finds that
    digest in the manifest."""
    fd = os.open(path, _OPEN)
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = f.read()
    return data, digest_of(data, algorithm)


def _refuse(verified: VerifiedCheckpoint, path: Path, why: str) -> NoReturn:
    problem = f"{path}: {why}"
    raise VerificationError(problem, path=path, step=verified.checkpoint.step, problems=(problem,))
