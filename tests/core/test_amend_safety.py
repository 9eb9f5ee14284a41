"""amend() and promote_named() under attack (issue 21): a concurrent commit or delete of
what they carry over, a symlinked directory inside the checkpoint, a forked child, a
checksum this Python lacks; and staging(step) under nested commits of one step."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from treeutil import contents, write

from atomic_ckpt import (
    TMP_INFIX,
    CheckpointDir,
    CheckpointNotFoundError,
    CommitStateError,
    ManifestError,
    StepConflictError,
    VerificationError,
)
from atomic_ckpt._core.l1_names.names import ROOT_LOCK
from atomic_ckpt._core.l4_protocol import amend as _amend

OLD = {"model.bin": b"M" * 50, "shards/a.bin": b"A" * 32, "config.json": b"{}"}
NEW = {"model.bin": b"N" * 100, "shards/a.bin": b"B" * 32, "config.json": b"[]"}


def leftovers(root: Path) -> list[str]:
    """Staging dirs, old copies, lock files and temporary links left in the root."""
    return sorted(n for n in os.listdir(root) if TMP_INFIX in n and n != ROOT_LOCK)


def committed(ckpts: CheckpointDir, step: int, files: dict[str, bytes]) -> None:
    with ckpts.commit(step) as path:
        write(path, files)


def amend_while(ckpts: CheckpointDir, step: int, meanwhile: Any = None, **kw: Any) -> None:
    """Amend ``step`` adding val.json, running ``meanwhile()`` inside the block."""
    with ckpts.amend(step, **kw) as path:
        (path / "val.json").write_text("{}")
        if meanwhile is not None:
            meanwhile()


def in_another_thread(work: Callable[[], None]) -> None:
    """Run ``work`` as another writer does: in another thread (a second commit of the step
    nested in the amend's own thread is refused as a nested commit)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(60)
    assert errors == []


def inodes_below(directory: Path) -> set[tuple[int, int]]:
    """(device, inode) of every regular file below ``directory``."""
    out = set()
    for dirpath, _dirs, names in os.walk(directory):
        for name in names:
            st = os.lstat(Path(dirpath, name))
            out.add((st.st_dev, st.st_ino))
    return out


# ================================================================ a concurrent writer (item 1)


def test_a_step_committed_again_during_the_amend_is_never_mixed(ckpts: CheckpointDir) -> None:
    """Another commit of the step while the amend's block runs: the amend fails with
    StepConflictError and the step is the other writer's, whole, verifying."""
    committed(ckpts, 3, OLD)
    another = CheckpointDir(ckpts.root)
    with pytest.raises(StepConflictError, match="amend"):
        amend_while(ckpts, 3, lambda: in_another_thread(lambda: committed(another, 3, NEW)))
    assert contents(ckpts.verify(3).path) == NEW
    assert leftovers(ckpts.root) == []


def test_a_step_replaced_after_the_carry_over_is_not_promoted_over(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step is checked again under the lock at the promotion: a commit landing between
    the carry-over and the exchange makes the amend fail, the newer version stays."""
    committed(ckpts, 3, OLD)
    real = _amend.carry_over
    hit: list[bool] = []

    def then_commit(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        in_another_thread(lambda: committed(CheckpointDir(ckpts.root), 3, NEW))
        hit.append(True)
        return out

    monkeypatch.setattr(_amend, "carry_over", then_commit)
    with pytest.raises(StepConflictError):
        amend_while(ckpts, 3)
    assert hit == [True]
    assert contents(ckpts.verify(3).path) == NEW
    assert leftovers(ckpts.root) == []


def test_a_metadata_amend_by_another_writer_meanwhile_is_not_lost(ckpts: CheckpointDir) -> None:
    """A metadata-only amend landing during a file amend: the file amend fails rather than
    publish over it with the manifest it read first (a lost update)."""
    committed(ckpts, 3, OLD)
    another = CheckpointDir(ckpts.root)

    def other_amend() -> None:
        with another.amend(3, metadata={"best": True}):
            pass

    with pytest.raises(StepConflictError):
        amend_while(ckpts, 3, lambda: in_another_thread(other_amend))
    assert ckpts.verify(3).manifest.metadata == {"best": True}
    assert contents(ckpts.path_of(3)) == OLD


def test_a_step_deleted_during_the_amend_is_checkpoint_not_found(ckpts: CheckpointDir) -> None:
    """delete(step) while the block runs: CheckpointNotFoundError naming the step (not a raw
    FileNotFoundError about link paths), and no step is created."""
    committed(ckpts, 3, OLD)
    another = CheckpointDir(ckpts.root)
    with pytest.raises(CheckpointNotFoundError, match="deleted") as info:
        amend_while(ckpts, 3, lambda: another.delete(3))
    assert info.value.step == 3
    assert not os.path.lexists(ckpts.path_of(3))
    assert leftovers(ckpts.root) == []


def test_a_named_checkpoint_committed_again_during_its_promotion_is_never_mixed(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit_named() of the same name between promote_named()'s read and its carry-over:
    the promotion fails (StepConflictError), the newer named checkpoint stays whole."""
    with ckpts.commit_named("interrupted") as path:
        write(path, OLD)
    real = _amend.carry_over
    hit: list[bool] = []

    def commit_first(*args: Any, **kwargs: Any) -> Any:
        with CheckpointDir(ckpts.root).commit_named("interrupted") as again:
            write(again, NEW)
        hit.append(True)
        return real(*args, **kwargs)

    monkeypatch.setattr(_amend, "carry_over", commit_first)
    with pytest.raises(StepConflictError):
        ckpts.promote_named("interrupted", 4)
    assert hit == [True]
    assert ckpts.steps() == []
    assert contents(ckpts.get_named("interrupted").path) == NEW
    assert leftovers(ckpts.root) == []


# ================================================================ links inside (item 2)


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A directory outside the root holding a file a checkpoint's directory could point to."""
    out = tmp_path / "elsewhere"
    write(out, {"a.bin": b"S" * 32})  # same size as the committed shards/a.bin
    return out


def test_amend_never_follows_a_symlinked_directory_inside_the_checkpoint(
    ckpts: CheckpointDir, elsewhere: Path
) -> None:
    """`3/shards -> /elsewhere` after the commit: the amend refuses (VerificationError
    naming the path), links nothing from outside, and the step is left as it is."""
    committed(ckpts, 3, OLD)
    shards = ckpts.path_of(3) / "shards"
    (shards / "a.bin").unlink()
    shards.rmdir()
    shards.symlink_to(elsewhere)
    outside = inodes_below(elsewhere)
    with pytest.raises(VerificationError, match="shards"):
        amend_while(ckpts, 3)
    assert not inodes_below(ckpts.root) & outside
    assert os.stat(elsewhere / "a.bin").st_nlink == 1
    assert os.readlink(shards) == str(elsewhere)
    assert leftovers(ckpts.root) == []


def test_amend_never_copies_through_a_symlinked_directory_where_links_are_refused(
    ckpts: CheckpointDir, elsewhere: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The copy fallback (hard links refused) does not follow the link either."""
    import errno

    committed(ckpts, 3, OLD)
    shards = ckpts.path_of(3) / "shards"
    (shards / "a.bin").unlink()
    shards.rmdir()
    shards.symlink_to(elsewhere)
    refused: list[str] = []

    def no_link(src: Any, dst: Any, **kwargs: Any) -> None:
        refused.append(Path(dst).name)
        raise OSError(errno.EXDEV, "no hard links here")

    monkeypatch.setattr(os, "link", no_link)
    with pytest.raises(VerificationError, match="shards"):
        amend_while(ckpts, 3)
    assert refused  # the fallback was taken for the files before shards/
    assert not any(p.read_bytes() == b"S" * 32 for p in ckpts.root.rglob("*") if p.is_file())
    assert leftovers(ckpts.root) == []


def test_promote_named_never_follows_a_symlinked_directory_inside_it(
    ckpts: CheckpointDir, elsewhere: Path
) -> None:
    """The same for promote_named(): refused, nothing from outside comes in, no step."""
    with ckpts.commit_named("interrupted") as path:
        write(path, OLD)
    shards = ckpts.root / "interrupted" / "shards"
    (shards / "a.bin").unlink()
    shards.rmdir()
    shards.symlink_to(elsewhere)
    outside = inodes_below(elsewhere)
    with pytest.raises(VerificationError, match="shards"):
        ckpts.promote_named("interrupted", 4)
    assert not inodes_below(ckpts.root) & outside
    assert ckpts.steps() == []
    assert leftovers(ckpts.root) == []


def test_amend_refuses_a_committed_file_replaced_by_a_symlink(
    ckpts: CheckpointDir, elsewhere: Path
) -> None:
    """A regular file of the manifest that is now a symlink is not carried (as a link to
    the link, which would not verify): VerificationError, the step untouched."""
    committed(ckpts, 3, OLD)
    model = ckpts.path_of(3) / "model.bin"
    model.unlink()
    model.symlink_to(elsewhere / "a.bin")
    with pytest.raises(VerificationError, match=r"model\.bin"):
        amend_while(ckpts, 3)
    assert model.is_symlink()
    assert leftovers(ckpts.root) == []


# ================================================================ a forked child (item 11)


@pytest.mark.parametrize("files", [True, False], ids=["files", "metadata-only"])
def test_a_child_forked_inside_amend_never_carries_it_out(
    ckpts: CheckpointDir, files: bool
) -> None:
    """A child leaving the block normally gets CommitStateError and touches nothing (not
    the parent's staging dir, not the live marker); the parent's amend then succeeds."""
    committed(ckpts, 3, OLD)
    read, written = os.pipe()
    pid = -1
    try:
        with ckpts.amend(3, metadata={"who": "parent"}) as path:
            if files:
                (path / "val.json").write_text("{}")
            before = sorted(os.listdir(path))
            pid = os.fork()
            if pid != 0:
                os.close(written)
                os.waitpid(pid, 0)  # the child has left the block before the parent does
                assert sorted(os.listdir(path)) == before
    except CommitStateError as exc:
        if pid == 0:  # pragma: no cover - the child
            os.write(written, b"refused" if "forked" in str(exc) else b"other")
            os._exit(0)
        raise
    except BaseException:
        if pid == 0:  # pragma: no cover - the child
            os.write(written, b"failed")
            os._exit(0)
        raise
    if pid == 0:  # pragma: no cover - the child
        os.write(written, b"carried out")
        os._exit(0)
    assert os.read(read, 64) == b"refused"
    os.close(read)
    ckpt = ckpts.verify(3)
    assert ckpt.manifest.metadata == {"who": "parent"}
    assert contents(ckpt.path) == ({**OLD, "val.json": b"{}"} if files else OLD)
    assert leftovers(ckpts.root) == []


# ================================================================ a missing checksum (item 19)


def _rewrite_algorithm(directory: Path, algorithm: str) -> None:
    """Make the marker of ``directory`` name ``algorithm`` (its CRC stays valid: the
    algorithm is in the header, which has no checksum of its own)."""
    marker = directory / "checkpoint_complete"
    data = marker.read_bytes()
    assert b'"checksum": "xxh3_128"' in data
    named = f'"checksum": "{algorithm}"'.encode()
    marker.write_bytes(data.replace(b'"checksum": "xxh3_128"', named, 1))


def test_amend_with_files_under_an_algorithm_not_installed_says_so(
    ckpts: CheckpointDir,
) -> None:
    """New files cannot be hashed with the manifest's algorithm: ManifestError naming it and
    the step (no bare KeyError), and the step is untouched."""
    committed(ckpts, 3, OLD)
    _rewrite_algorithm(ckpts.path_of(3), "blake3")
    with pytest.raises(ManifestError, match=re.escape("'blake3'")) as info:
        amend_while(ckpts, 3)
    assert info.value.step == 3
    assert not isinstance(info.value, KeyError)
    assert contents(ckpts.path_of(3)) == OLD
    assert leftovers(ckpts.root) == []


def test_amend_without_new_files_under_an_algorithm_not_installed_works(
    ckpts: CheckpointDir,
) -> None:
    """Removing a file or changing metadata hashes nothing: it works, the entries kept as
    recorded (verify() then reports it cannot check that algorithm, as before)."""
    committed(ckpts, 3, OLD)
    _rewrite_algorithm(ckpts.path_of(3), "blake3")
    with ckpts.amend(3, remove=["config.json"], metadata={"a": 1}):
        pass
    ckpt = ckpts.get(3)
    assert ckpt.manifest.checksum == "blake3"
    assert ckpt.manifest.metadata == {"a": 1}
    assert contents(ckpt.path) == {k: v for k, v in OLD.items() if k != "config.json"}
    with pytest.raises(VerificationError, match="blake3"):
        ckpts.verify(3)


def test_promote_named_under_an_algorithm_not_installed_keeps_it(ckpts: CheckpointDir) -> None:
    """Promotion hashes nothing: the step is made, recording the same algorithm."""
    with ckpts.commit_named("interrupted") as path:
        write(path, OLD)
    _rewrite_algorithm(ckpts.root / "interrupted", "blake3")
    ckpt = ckpts.promote_named("interrupted", 4)
    assert ckpt.manifest.checksum == "blake3"
    assert contents(ckpt.path) == OLD
    assert leftovers(ckpts.root) == []


# ================================================================ staging(step) (item 12)


def test_staging_is_the_outer_commit_once_a_nested_commit_of_the_step_ends(
    ckpts: CheckpointDir,
) -> None:
    """Two open commits of one step (the newer begun in another thread, as a second in
    this thread is refused): staging() is the newest open one, and the outer one again
    once the inner one ended (published or aborted)."""

    def begun_elsewhere() -> Any:
        made: list[Any] = []
        thread = threading.Thread(target=lambda: made.append(ckpts.begin(5)))
        thread.start()
        thread.join(60)
        return made[0]

    outer = ckpts.begin(5)
    inner = begun_elsewhere()
    assert ckpts.staging(5) == inner.path
    inner.abort()
    assert ckpts.staging(5) == outer.path
    again = begun_elsewhere()
    assert ckpts.staging(5) == again.path
    again.publish()
    assert ckpts.staging(5) == outer.path
    outer.abort()
    assert ckpts.staging(5) is None


def test_a_metadata_amend_of_a_step_deleted_meanwhile_is_checkpoint_not_found(
    ckpts: CheckpointDir,
) -> None:
    """The metadata-only path says the same as the other: deleted, nothing written."""
    committed(ckpts, 3, OLD)
    another = CheckpointDir(ckpts.root)

    def delete_meanwhile() -> None:
        with ckpts.amend(3, metadata={"a": 1}):
            another.delete(3)

    with pytest.raises(CheckpointNotFoundError, match="deleted"):
        delete_meanwhile()
    assert not os.path.lexists(ckpts.path_of(3))


def test_a_metadata_amend_never_writes_through_a_step_replaced_by_a_link(
    ckpts: CheckpointDir, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step swapped for a symlink to (a copy of) itself before the marker is rewritten:
    the amend refuses (StepConflictError), and the marker behind the link is not rewritten."""
    committed(ckpts, 3, OLD)
    copy = tmp_path / "copy"
    real = _amend._rewrite_marker
    swapped: list[bytes] = []

    def swap_then_rewrite(*args: Any) -> None:
        os.rename(ckpts.path_of(3), copy)
        os.symlink(copy, ckpts.path_of(3))
        swapped.append((copy / "checkpoint_complete").read_bytes())
        real(*args)

    monkeypatch.setattr(_amend, "_rewrite_marker", swap_then_rewrite)
    with pytest.raises(StepConflictError), ckpts.amend(3, metadata={"a": 1}):
        pass
    assert len(swapped) == 1
    assert (copy / "checkpoint_complete").read_bytes() == swapped[0]
