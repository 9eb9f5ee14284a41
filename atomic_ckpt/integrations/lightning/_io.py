"""The ``CheckpointIO`` plugin of :mod:`atomic_ckpt.integrations.lightning`: atomic, durable
``.ckpt`` saves that carry their checksum, verified loads, durable deletes, atomic ``last``
links, and the ordered background thread of ``async_save=True``; also :func:`_local`, the
local-path check the sharded strategies share.

Imported by the public module after its check that torch and Lightning are installed.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any, cast

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from atomic_ckpt import atomic_write, clean_temporaries, remove_directory, temp_name
from atomic_ckpt._core.l1_names.errors import disk_full
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l2_syscalls.checksums import new_hasher
from atomic_ckpt._core.l4_protocol import dedup as _dedup
from atomic_ckpt.integrations.lightning import _checked
from atomic_ckpt.integrations.lightning._links import _replace_link
from atomic_ckpt.torch._bytes import _ViewReader

if TYPE_CHECKING:
    # Typed against pytorch_lightning (it ships py.typed; the ``lightning`` package does not).
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO as _CheckpointIOBase
else:
    _CheckpointIOBase = object

log = logging.getLogger("atomic_ckpt.integrations.lightning")  # the public module's, as before


def _default_map_location(storage: Any, location: Any) -> Any:
    return storage


_CALLER_DEPTH = 8
"""How many frames above a save or a load to look for the Trainer that asked for it
(Lightning: the Strategy's frame, then its wrappers', then the Trainer's or the
checkpoint connector's: 2 to 4)."""


class _AtomicCheckpointIO(_CheckpointIOBase):
    """A ``CheckpointIO`` that saves each ``.ckpt`` atomically and durably.

    ``async_save=True`` writes in a background thread, in order (see the docstring of
    :mod:`atomic_ckpt.integrations.lightning`). ``durable=False`` skips the fsyncs: still
    atomic against a crash of the process, not against a power loss.

    ``checksum`` is the algorithm each saved file records its checksum with (``"xxh3_128"``,
    the default, ``"crc32"``, ``"sha256"``; hashed as ``torch.save`` writes, stored in the
    file's zip comment, which every zip reader and ``torch.load`` ignore), or None for none.
    ``verify_on_load=True`` checks each file against that checksum before it is loaded, and
    loads it from the very pages hashed (each byte fetched from storage once, as long as the
    file fits in the page cache beside the loaded state); a file that does not match, or
    carries no checksum (saved by another ``CheckpointIO``, or with ``checksum=None``), is
    refused with a :class:`~atomic_ckpt.VerificationError` naming it. The sharded strategies
    load full-state files the same way and refuse a checkpoint directory (its shards carry
    no checksums).

    ``dedup=True``: a save whose bytes equal the previous save's (the same size and the
    same checksum, the one each file carries), such as ``last.ckpt`` of
    ``save_last=True`` next to the top-k file just saved, is made a hard link (or
    reflink) to that file instead of a second copy, if that file is still the one saved
    (same inode, size and modification time); :attr:`deduped` lists them.
    """

    def __init__(
        self,
        *,
        async_save: bool = False,
        durable: bool = True,
        checksum: str | None = "xxh3_128",
        verify_on_load: bool = False,
        dedup: bool = False,
    ) -> None:
        super().__init__()
        if checksum is not None:
            new_hasher(checksum)  # ValueError now, not at the first save
        elif dedup:
            raise ValueError("dedup=True compares the checksums saves carry: not checksum=None")
        self.async_save = async_save
        self.durable = durable
        self.checksum = checksum
        self.verify_on_load = verify_on_load
        self.dedup = dedup
        self.deduped: dict[str, str] = {}
        """Saves made links to the previous one: path -> ``"hardlink"`` or ``"reflink"``."""
        self._previous: tuple[str, str, _dedup.FileId] | None = None  # path, checksum, id
        self._executor: ThreadPoolExecutor | None = None
        self._queued: list[Future[None]] = []
        self._error: BaseException | None = None
        self._skipped: list[str] = []
        self._state = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(async_save={self.async_save}, durable={self.durable}, "
            f"checksum={self.checksum!r}, verify_on_load={self.verify_on_load}, "
            f"dedup={self.dedup})"
        )

    def __getstate__(self) -> dict[str, Any]:
        # A spawned trainer pickles its plugins: nothing may be in flight then.
        self.wait()
        state = self.__dict__.copy()
        state.update(_executor=None, _queued=[], _state=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._state = threading.Lock()

    # ------------------------------------------------------------ CheckpointIO

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` to ``path`` atomically and durably.

        With ``async_save=True`` a save asked for by a checkpoint callback (``ModelCheckpoint``
        and its subclasses) is queued; any other (``trainer.save_checkpoint(path)`` called by
        a script or a hook, this method called directly) first waits for what is queued and
        is then written on the caller's thread: the file is whole and durable when it
        returns. Such a save first removes what killed saves left in its directory
        (:func:`~atomic_ckpt.clean_temporaries`, which leaves a live write alone): no fit's
        setup cleans a directory outside the ``ModelCheckpoint`` dirpath."""
        if storage_options is not None:
            raise TypeError(
                f"{type(self).__name__}.save_checkpoint takes no storage_options "
                f"(got {storage_options!r})"
            )
        target = _local(path)
        queued = self._queues()
        if queued:
            self._refuse_unordered_links()
            # Copy the tensors now, on the caller's thread: training goes on changing them.
            checkpoint = apply_to_collection(checkpoint, torch.Tensor, _snapshot)
        job = self._save_now if queued else self._save_by_hand
        self._run(job, checkpoint, target, what=f"save {target}", queued=queued)

    def remove_checkpoint(self, path: Any) -> None:
        """Delete ``path`` (a file, or a sharded checkpoint's directory) durably, after every
        save queued before it (missing is fine); queued only for a checkpoint callback, as
        :meth:`save_checkpoint` is."""
        target = _local(path)
        self._run(self._remove_now, target, what=f"remove {target}", queued=self._queues())

    def load_checkpoint(
        self,
        path: Any,
        map_location: Any | None = _default_map_location,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Load ``path`` (after every queued save), with ``weights_only=True`` by default;
        with ``verify_on_load``, only if it matches the checksum it carries. A ``path``
        that is a symlink (``last.ckpt`` of ``save_last="link"``) loads the file it names."""
        if self.async_save:
            self._refuse_unordered_links()  # a resumed fit: before it trains
        self.wait()
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        only = True if weights_only is None else weights_only
        if not self.verify_on_load:
            loaded: dict[str, Any] = torch.load(path, map_location=map_location, weights_only=only)
            return loaded
        # The file a link names (``last.ckpt`` of save_last="link", or a user's own):
        # verified and loaded by its real path, since the check opens without following a
        # link. Only the path given is resolved: inside a checkpoint, none is followed.
        path = os.path.realpath(path)
        with _checked.verified(path) as view:
            # Verified: read from the very mapping that was hashed, never by reopening the
            # path (which may name another file by now).
            reader = cast(IO[bytes], _ViewReader(view))  # read/seek/tell: what torch.load uses
            loaded = torch.load(reader, map_location=map_location, weights_only=only)
        return loaded

    def teardown(self) -> None:
        """Wait for every queued operation, stop the background thread, raise its error."""
        try:
            self.wait()
        finally:
            executor, self._executor = self._executor, None
            if executor is not None:
                executor.shutdown(wait=True)

    # ------------------------------------------------------------ beyond CheckpointIO

    def link(self, filepath: Any, linkpath: Any) -> None:
        """Point the symlink ``linkpath`` at ``filepath`` atomically, after every queued save.

        The link is relative (it survives moving the directory). The target must exist
        when the link is made: a link never dangles. Queued only for a checkpoint callback,
        as :meth:`save_checkpoint` is.
        """
        target, link = _local(filepath), _local(linkpath)
        what = f"link {link} -> {target}"
        self._run(self._link_now, target, link, what=what, queued=self._queues())

    def wait(self) -> None:
        """Block until every queued operation is done (durable); raise a background error."""
        for future in list(self._queued):
            future.result()
        self._queued = [f for f in self._queued if not f.done()]
        self._raise_pending()

    # ------------------------------------------------------------ internals

    def _refuse_unordered_links(self) -> None:
        """Raise ValueError if the Trainer this save or load is for has a callback that links
        ``last`` itself (the stock ``ModelCheckpoint(save_last="link")``).

        It links on the caller's thread as soon as the save is queued: in a new directory
        the link fails (FileNotFoundError: nothing has created it yet), elsewhere ``last``
        names a file not yet written, and a crash then leaves no usable ``last``. No
        ordering here can make that link safe, so the combination is refused before its
        first save. ``CheckpointIO`` has no setup hook that sees the Trainer: this runs at
        its first call (the first save of a new fit, the load of a resumed one), for the
        Trainer found among the callers (none found: nothing is checked).
        """
        trainer = _calling_trainer(self)
        if trainer is None:
            return
        for callback in getattr(trainer, "checkpoint_callbacks", ()):
            if getattr(type(callback), "_links_through_io", False):
                continue  # AtomicModelCheckpoint: its links are queued with the saves
            if getattr(callback, "save_last", None) == "link" and callback.save_top_k != 0:
                raise ValueError(
                    f"{type(self).__name__}(async_save=True) cannot be used with "
                    f"{type(callback).__name__}(save_last='link'): it links last.ckpt to a "
                    "checkpoint still being written in the background (a crash then leaves "
                    "no usable last; in a new directory the first link fails). Use "
                    "atomic_ckpt.integrations.lightning.AtomicModelCheckpoint (the same "
                    "arguments), which links in order with the saves; or save_last=True; "
                    "or async_save=False"
                )

    def _save_now(self, checkpoint: dict[str, Any], path: str) -> None:
        try:
            self._write(checkpoint, path)
        except OSError as exc:  # a full disk says so, in a commit's words (issue 30)
            full = disk_full(exc, Path(path).parent, f"the save of {path}")
            if full is None:
                raise
            raise full from exc

    def _write(self, checkpoint: dict[str, Any], path: str) -> None:
        digest: str | None = None
        with atomic_write(path, durable=self.durable, parents=True) as tmp:
            if self.checksum is None:
                torch.save(checkpoint, tmp)
            else:
                digest = _checked.save(checkpoint, tmp, self.checksum)
                if self.dedup:
                    self._link_previous(path, tmp, digest)
        if self.dedup and digest is not None:
            self._previous = (os.path.abspath(path), digest, _dedup.file_id(os.lstat(path)))

    def _save_by_hand(self, checkpoint: dict[str, Any], path: str) -> None:
        # After every queued save (so none of ours is live in the directory).
        directory = os.path.dirname(os.path.abspath(path))
        for removed in clean_temporaries(directory, durable=self.durable):
            log.warning("removed %s, left by an interrupted save", removed)
        self._save_now(checkpoint, path)

    def _link_previous(self, path: str, tmp: Path, digest: str) -> None:
        """Replace the file written at ``tmp`` by a link to the previous save if both hold
        the same bytes and that one is still the file saved (a new name first, renamed over
        ``tmp``: what ``atomic_write`` then renames into place is whole either way)."""
        before = self._previous
        if before is None or before[1] != digest or before[2][2] != os.lstat(tmp).st_size:
            return
        source = Path(before[0])
        try:
            fd = _fs.open_dir(source.parent)
        except OSError:
            return
        try:
            link = tmp.with_name(temp_name(source.name))
            how = _dedup.link_same(fd, source.name, link, before[2], tmp)
        finally:
            os.close(fd)
        if how is not None:
            _fs.rename(link, tmp)
            self.deduped[path] = how
            log.info("%s: the same bytes as %s, saved as a %s to it", path, source, how)

    def _remove_now(self, path: str) -> None:
        # A sharded checkpoint is a directory: it disappears at once, then is removed.
        remove_directory(path, durable=self.durable)

    def _link_now(self, filepath: str, linkpath: str) -> None:
        if not os.path.exists(filepath):
            raise FileNotFoundError(
                f"cannot link {linkpath} to {filepath}: it does not exist (a link never dangles)"
            )
        relative = os.path.relpath(filepath, os.path.dirname(os.path.abspath(linkpath)))
        _replace_link(relative, linkpath, durable=self.durable)

    def _queues(self) -> bool:
        """Whether the operation being asked for goes to the background thread: with
        ``async_save=True``, when a checkpoint callback asked for it (a ``Checkpoint`` of
        Lightning among the callers: ``ModelCheckpoint`` saving, deleting or linking). Any
        other caller gets it done, durably, before the call returns."""
        return self.async_save and _from_checkpoint_callback()

    def _run(self, job: Callable[..., None], *args: Any, what: str, queued: bool) -> None:
        self._raise_pending()
        if not queued:
            self.wait()  # in order: after everything queued before it
            job(*args)
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="atomic_ckpt-lightning")
        self._queued = [f for f in self._queued if not f.done()]
        self._queued.append(self._executor.submit(self._background, job, args, what))

    def _background(self, job: Callable[..., None], args: tuple[Any, ...], what: str) -> None:
        with self._state:
            if self._error is not None:
                # Something queued before this failed: run nothing that may depend on it
                # (a delete of the file a failed save was to replace, say).
                self._skipped.append(what)
                return
        try:
            job(*args)
        except BaseException as exc:
            with self._state:
                self._error = exc
            # Now, on the rank it failed on (every rank logs its own failure): the error
            # itself is raised on the training thread by the next save, load or link, or
            # by teardown (the end of fit), so that fit never ends as if it had saved.
            log.error(
                "background checkpoint %s failed on rank %d: %r; it will be raised by the "
                "next save or at teardown, and nothing queued after it runs",
                what,
                _rank(),
                exc,
                exc_info=exc,
            )

    def _raise_pending(self) -> None:
        with self._state:
            failed = self._error is not None
        if not failed:
            return
        # Let what is still queued see the failure (and skip) before reporting it.
        for future in list(self._queued):
            future.result()
        self._queued = []
        with self._state:
            error, self._error = self._error, None
            skipped, self._skipped = self._skipped, []
        assert error is not None
        if skipped:
            error.add_note("atomic_ckpt: not done because of this error: " + "; ".join(skipped))
            log.warning("background checkpoint error; skipped: %s", "; ".join(skipped))
        raise error


def _calling_trainer(io: Any) -> Any | None:
    """The Lightning Trainer among the callers of ``io``'s method (the caller of that is 2
    frames up): a ``self`` (or its ``trainer``) with ``checkpoint_callbacks`` whose
    strategy's CheckpointIO is ``io`` or wraps it. None if there is none."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_CALLER_DEPTH):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        for candidate in (owner, getattr(owner, "__dict__", {}).get("trainer")):
            if _uses(candidate, io):
                return candidate
        frame = frame.f_back
    return None


def _from_checkpoint_callback() -> bool:
    """Whether a Lightning checkpoint callback (an instance of ``Checkpoint``, of
    ``lightning`` or ``pytorch_lightning``: ``ModelCheckpoint`` and its subclasses) is among
    the callers of the plugin's method that asks (up to :data:`_CALLER_DEPTH` frames)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_CALLER_DEPTH):
        if frame is None:
            return False
        owner = frame.f_locals.get("self")
        if owner is not None and any(
            c.__name__ == "Checkpoint" and c.__module__.endswith("callbacks.checkpoint")
            for c in type(owner).__mro__
        ):
            return True
        frame = frame.f_back
    return False


def _uses(trainer: Any, io: Any) -> bool:
    if trainer is None or not hasattr(type(trainer), "checkpoint_callbacks"):
        return False
    current = getattr(getattr(trainer, "strategy", None), "checkpoint_io", None)
    for _ in range(_CALLER_DEPTH):  # Lightning wraps at most once or twice
        if current is None:
            return False
        if current is io:
            return True
        current = getattr(current, "checkpoint_io", None)
    return False


def _rank() -> int:
    """This process's global rank (0 without torch.distributed)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


def _local(path: Any) -> str:
    """``path`` as a local path; a URL (``s3://...``) is refused: the commit is a local rename."""
    text: str = os.fspath(path)
    if "://" in text:
        raise ValueError(
            f"AtomicCheckpointIO writes local files only, not {text!r}: use Lightning's "
            "TorchCheckpointIO for object storage"
        )
    return text


def _snapshot(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()
