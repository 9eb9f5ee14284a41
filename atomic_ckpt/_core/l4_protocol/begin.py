"""Steps 1 and 2 of the commit protocol: check the target, take the staging lock, create
the staging directory, and hand back the open :class:`~atomic_ckpt.Commit`."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Collection
from pathlib import Path
from typing import SupportsIndex

from atomic_ckpt._core.l1_names.errors import (
    ManifestError,
    MarkerIsDirectoryError,
    NewerFormatError,
    StepConflictError,
)
from atomic_ckpt._core.l1_names.names import MARKER, not_one_string
from atomic_ckpt._core.l2_syscalls import fs as _fs
from atomic_ckpt._core.l3_formats.manifest import check_metadata
from atomic_ckpt._core.l3_formats.read import moved_by_hand, read_marker
from atomic_ckpt._core.l4_protocol import dedup as _dedup
from atomic_ckpt._core.l4_protocol import delete as _delete
from atomic_ckpt._core.l4_protocol import stage as _stage
from atomic_ckpt._core.l4_protocol.commit import Commit
from atomic_ckpt._core.l4_protocol.joining import check_own_aliases, refuse_nested
from atomic_ckpt._core.l4_protocol.retention import RetentionPolicy
from atomic_ckpt._core.l4_protocol.root import Root, check_step

log = logging.getLogger("atomic_ckpt._core.l4_protocol.commit")


def begin(
    root: Root,
    step: SupportsIndex,
    *,
    metadata: object = None,
    retain: RetentionPolicy | None = None,
    aliases: Collection[str] = (),
    replace_aliases: bool = False,
    replace_unusable: bool = False,
    dedup: _dedup.Dedup = False,
) -> Commit:
    """Steps 1 and 2 of the protocol for ``step``: take a staging lock, create the staging dir."""
    step = check_step(step)
    name = root.name_of(step)
    return begin_as(
        root,
        step,
        name,
        metadata=metadata,
        retain=retain,
        aliases=aliases,
        replace_aliases=replace_aliases,
        replace_unusable=replace_unusable,
        dedup=dedup,
    )


def begin_as(
    root: Root,
    step: int | None,
    name: str,
    *,
    metadata: object = None,
    retain: RetentionPolicy | None = None,
    aliases: Collection[str] = (),
    replace_aliases: bool = False,
    replace_unusable: bool = False,
    dedup: _dedup.Dedup = False,
) -> Commit:
    """:func:`begin` for the directory ``name`` (a step's, or a named checkpoint's)."""
    not_one_string("aliases", aliases, "names")
    refuse_nested(root, name, step)
    alias_list = [_delete.check_alias(root, a) for a in aliases]
    check_own_aliases(name, alias_list)
    meta = check_metadata(metadata)
    dedup = _dedup.check(dedup, root)
    root.ensure()
    final = root.path / name
    _stage.check_target(final, step)
    if os.path.isdir(final):
        check_replaceable(final, step, replace=replace_unusable)
    # 1. The staging lock first, then the directory: clean() never sees a live save
    #    unlocked.
    staging, lock = _stage.make_staging(root, name)
    try:
        if alias_list:
            _probe_symlinks(root, staging, name)
        return Commit(
            root,
            step,
            name,
            staging,
            lock,
            metadata=meta,
            retain=retain,
            aliases=alias_list,
            replace_aliases=replace_aliases,
            dedup=dedup,
        )
    except BaseException as exc:  # e.g. EMFILE pinning the directory: leave nothing
        with contextlib.suppress(OSError):
            _fs.remove_tree(staging)
        try:
            lock.release(remove=True)
        except OSError as cleanup:
            exc.add_note(f"atomic_ckpt: removing {lock.path} also failed: {cleanup!r}")
        raise


_SYMLINK_PROBE = ".symlink-probe"
"""The link :func:`_probe_symlinks` makes (and removes) in a new, still empty, staging dir."""


def _probe_symlinks(root: Root, staging: Path, name: str) -> None:
    """SymlinksUnsupportedError, before the caller writes anything, where the root's
    filesystem makes no symlinks and aliases (symlinks) were asked for: a link made and
    removed in the staging directory (where a crash leaves it with the rest, ignored)."""
    probe = staging / _SYMLINK_PROBE
    try:
        _fs.symlink(name, probe)
    except OSError as exc:
        if not _delete.symlinks_refused(exc, staging):
            raise
        raise _delete.no_symlinks_error(exc, root, f"the aliases of {name!r}") from exc
    _fs.unlink(probe)


def check_replaceable(final: Path, step: int | None, *, replace: bool) -> None:
    """Refuse to commit over a checkpoint at ``final`` that this release must not lose
    unless ``replace``: one a newer atomic_ckpt wrote (a marker format version above this
    one's) or a complete checkpoint moved there by hand (its manifest names another step,
    or none: ``mv interrupted 5``). What has no marker, or one that cannot be read, is
    replaced with a warning saying so, as a save that crashed leaves it."""
    try:
        manifest = read_marker(final, body=False)
    except NewerFormatError as exc:
        what = f"a checkpoint a newer atomic_ckpt wrote ({exc})"
    except MarkerIsDirectoryError as exc:  # what that directory holds would be deleted
        what = f"an unusable checkpoint: {exc}"
    except (ManifestError, OSError) as exc:
        log.warning(
            "committing over %s, whose %s marker cannot be read (%s): the new checkpoint "
            "replaces it",
            final,
            MARKER,
            exc,
        )
        return
    else:
        if manifest is None:
            log.warning(
                "committing over %s, which has no %s marker (written before atomic_ckpt, or "
                "by a save that crashed): the new checkpoint replaces it",
                final,
                MARKER,
            )
            return
        if manifest.legacy or manifest.step == step:
            return  # this step's own checkpoint: a commit replaces it
        what = (
            f"a complete checkpoint moved or copied there by hand: {moved_by_hand(manifest, step)}"
        )
    if not replace:
        raise StepConflictError(
            f"{final} holds {what}. A commit there would replace it and lose it; move it "
            "away first, or pass replace_unusable=True to replace it knowingly",
            path=final,
            step=step,
        )
    log.warning("committing over %s (replace_unusable=True), which holds %s", final, what)
