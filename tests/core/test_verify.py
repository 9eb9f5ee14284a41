"""verify(): every manifest file is present with its size and checksum; links never followed."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import (
    MARKER,
    CheckpointDir,
    CheckpointError,
    CheckpointNotFoundError,
    VerificationError,
)
from atomic_ckpt._core.l3_formats import verify as _verify

FILES = {
    "model.bin": bytes(range(256)) * 8,
    "optim/state.pt": b"adam moments" * 10,
    "optim/sched.pt": b"scheduler",
    "training_state.json": b'{"step": 5}',
}


def write(directory: Path, files: Mapping[str, bytes]) -> None:
    for rel, data in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


@pytest.fixture
def ckpt(ckpts: CheckpointDir) -> Path:
    """A committed step 5 with nested files, a directory and an internal symlink."""
    with ckpts.commit(5) as path:
        write(path, FILES)
        (path / "best").symlink_to("model.bin")
    return ckpts.path_of(5)


def edit_manifest(ckpt: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    marker = ckpt / MARKER
    doc = json.loads(marker.read_bytes())
    edit(doc)
    marker.write_text(json.dumps(doc))


# ---------------------------------------------------------------- intact checkpoints


def test_intact_checkpoint_verifies(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A checkpoint as committed verifies and verify() returns it."""
    result = ckpts.verify(5)
    assert result.step == 5
    assert result.path == ckpt
    assert result == ckpts.get(5)


@pytest.mark.parametrize("algorithm", ["crc32", "sha256"])
def test_each_checksum_algorithm_verifies_and_detects(tmp_path: Path, algorithm: str) -> None:
    """Checkpoints committed with crc32 or sha256 verify, and a flipped byte is caught."""
    ckpts = CheckpointDir(tmp_path, checksum=algorithm)
    with ckpts.commit(1) as path:
        write(path, FILES)
    ckpts.verify(1)
    (tmp_path / "1" / "model.bin").write_bytes(b"\x01" + FILES["model.bin"][1:])
    with pytest.raises(VerificationError, match=f"{algorithm} checksum"):
        ckpts.verify(1)


def test_legacy_marker_verifies_presence_only(ckpts: CheckpointDir) -> None:
    """A legacy empty marker has nothing to check against: verify() passes."""
    path = ckpts.root / "3"
    write(path, {"model.bin": b"whatever"})
    (path / MARKER).write_bytes(b"")
    assert ckpts.verify(3).manifest.legacy


def test_internal_symlink_unchanged_verifies_even_if_dangling(
    ckpts: CheckpointDir, tmp_path: Path
) -> None:
    """A recorded symlink verifies by its target string; it is never followed."""
    outside = tmp_path / "outside"
    write(outside, {"secret.bin": b"s" * 10, "sub/deep.bin": b"d"})
    with ckpts.commit(1) as path:
        write(path, {"real.bin": b"r"})
        (path / "dangling").symlink_to(tmp_path / "does-not-exist")
        (path / "root").symlink_to("/")
        (path / "dirlink").symlink_to(outside)  # walked into, it would add unlisted files
        (path / "filelink").symlink_to(outside / "secret.bin")
    hashed: list[Path] = []
    real = _verify.checksum_file

    def checksum_file(path: Path, algorithm: str) -> str:
        hashed.append(Path(path))
        return real(path, algorithm)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_verify, "checksum_file", checksum_file)
        result = ckpts.verify(1)
    assert result == ckpts.get(1)
    assert (result.step, result.path) == (1, ckpts.path_of(1))
    links = {e.path: e.target for e in result.manifest.files if e.type == "symlink"}
    assert links == {
        "dangling": str(tmp_path / "does-not-exist"),
        "root": "/",
        "dirlink": str(outside),
        "filelink": str(outside / "secret.bin"),
    }
    assert hashed == [ckpts.path_of(1) / "real.bin"]  # the wrapper was hit, by the file only


# ---------------------------------------------------------------- what is detected


def test_missing_file_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A file listed in the manifest but gone from disk fails, naming that file."""
    (ckpt / "optim" / "state.pt").unlink()
    with pytest.raises(VerificationError, match="missing") as info:
        ckpts.verify(5)
    assert info.value.path == ckpt / "optim" / "state.pt"
    assert info.value.step == 5
    assert "optim/state.pt" in str(info.value)


def test_missing_directory_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A whole subdirectory gone from disk fails on its first file."""
    shutil.rmtree(ckpt / "optim")
    with pytest.raises(VerificationError) as info:
        ckpts.verify(5)
    assert info.value.path is not None
    assert "optim" in info.value.path.parts


@pytest.mark.parametrize("data", [b"", b"short", FILES["model.bin"] + b"\x00"])
def test_wrong_size_is_detected(ckpts: CheckpointDir, ckpt: Path, data: bytes) -> None:
    """A truncated or extended file fails with the actual and recorded sizes."""
    (ckpt / "model.bin").write_bytes(data)
    with pytest.raises(VerificationError, match="size") as info:
        ckpts.verify(5)
    assert info.value.path == ckpt / "model.bin"
    assert str(len(data)) in str(info.value)
    assert str(len(FILES["model.bin"])) in str(info.value)


def test_wrong_checksum_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A same-size file with different bytes (say, zero-filled) fails its checksum."""
    (ckpt / "model.bin").write_bytes(b"\x00" * len(FILES["model.bin"]))
    with pytest.raises(VerificationError, match="checksum") as info:
        ckpts.verify(5)
    assert info.value.path == ckpt / "model.bin"


def test_without_checksums_only_sizes_are_checked(tmp_path: Path) -> None:
    """With checksum=None a same-size change passes but a size change still fails."""
    ckpts = CheckpointDir(tmp_path, checksum=None)
    with ckpts.commit(1) as path:
        write(path, FILES)
    (tmp_path / "1" / "model.bin").write_bytes(b"\x00" * len(FILES["model.bin"]))
    ckpts.verify(1)
    (tmp_path / "1" / "model.bin").write_bytes(b"\x00")
    with pytest.raises(VerificationError, match="size"):
        ckpts.verify(1)


def test_first_bad_file_is_named(ckpts: CheckpointDir, ckpt: Path) -> None:
    """With several bad files, the error names the first in manifest (path) order."""
    (ckpt / "training_state.json").unlink()
    (ckpt / "model.bin").write_bytes(b"")
    with pytest.raises(VerificationError) as info:
        ckpts.verify(5)
    assert info.value.path == ckpt / "model.bin"


def test_file_replaced_by_a_directory_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A recorded file that is now a directory fails."""
    (ckpt / "training_state.json").unlink()
    (ckpt / "training_state.json").mkdir()
    with pytest.raises(VerificationError, match="regular file"):
        ckpts.verify(5)


def test_directory_replaced_by_a_file_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A recorded directory that is now a file fails."""
    shutil.rmtree(ckpt / "optim")
    (ckpt / "optim").write_bytes(b"")
    with pytest.raises(VerificationError):
        ckpts.verify(5)


def test_retargeted_symlink_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A recorded symlink that now points elsewhere fails."""
    (ckpt / "best").unlink()
    (ckpt / "best").symlink_to("training_state.json")
    with pytest.raises(VerificationError, match="symlink"):
        ckpts.verify(5)


def test_manifest_of_another_step_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A checkpoint copied from another step's directory is not complete: verify() and
    the scanner agree (its manifest records step 5)."""
    shutil.copytree(ckpt, ckpts.root / "6")
    with pytest.raises(CheckpointNotFoundError, match="records step 5"):
        ckpts.verify(6)
    assert ckpts.steps() == [5]


# ---------------------------------------------------------------- never follow a link


def test_file_replaced_by_a_symlink_to_an_identical_copy_fails(
    ckpts: CheckpointDir, ckpt: Path, tmp_path: Path
) -> None:
    """A recorded file swapped for a symlink fails, even if the target has the same bytes."""
    copy = tmp_path / "copy.bin"
    copy.write_bytes(FILES["model.bin"])
    (ckpt / "model.bin").unlink()
    (ckpt / "model.bin").symlink_to(copy)
    hashed: list[Path] = []
    real = _verify.checksum_file

    def checksum_file(path: Path, algorithm: str) -> str:
        hashed.append(Path(path))
        return real(path, algorithm)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(_verify, "checksum_file", checksum_file)
        with pytest.raises(VerificationError, match="regular file") as info:
            ckpts.verify(5)
    assert info.value.path == ckpt / "model.bin"
    assert ckpt / "model.bin" not in hashed
    assert copy not in hashed


def test_directory_replaced_by_a_symlink_to_an_identical_copy_fails(
    ckpts: CheckpointDir, ckpt: Path, tmp_path: Path
) -> None:
    """A recorded directory swapped for a symlink to an identical copy fails (not traversed)."""
    shutil.copytree(ckpt / "optim", tmp_path / "optim-copy")
    shutil.rmtree(ckpt / "optim")
    (ckpt / "optim").symlink_to(tmp_path / "optim-copy")
    with pytest.raises(VerificationError, match="directory"):
        ckpts.verify(5)


# ---------------------------------------------------------------- hand-edited manifests


@pytest.mark.parametrize(
    "bad_path",
    [
        pytest.param("/etc/hostname", id="absolute"),
        pytest.param("../outside.bin", id="dotdot"),
        pytest.param("optim/../../outside.bin", id="climbs-out"),
        pytest.param("./model.bin", id="not-normalized"),
        pytest.param("..", id="parent"),
    ],
)
def test_manifest_with_an_unsafe_path_is_rejected(
    ckpts: CheckpointDir, ckpt: Path, bad_path: str
) -> None:
    """A hand-edited manifest with an absolute or `..` path is rejected, never looked up."""
    outside = ckpts.root / "outside.bin"
    outside.write_bytes(b"x")  # exists with the recorded size: only the path check can catch it

    def edit(doc: dict[str, Any]) -> None:
        doc["files"].append({"path": bad_path, "type": "file", "size": 1})

    edit_manifest(ckpt, edit)
    with pytest.raises(CheckpointError, match="unsafe path") as info:
        ckpts.verify(5)
    assert info.value.step == 5
    assert ckpts.steps() == []  # and the scanner no longer reports the step as complete


def test_manifest_with_a_wrong_recorded_size_is_detected(ckpts: CheckpointDir, ckpt: Path) -> None:
    """A hand-edited size in the manifest no longer matches the file."""

    def edit(doc: dict[str, Any]) -> None:
        for entry in doc["files"]:
            if entry["path"] == "model.bin":
                entry["size"] += 1

    edit_manifest(ckpt, edit)
    with pytest.raises(VerificationError, match="size"):
        ckpts.verify(5)


# ---------------------------------------------------------------- absent steps


def test_verify_of_an_absent_or_unmarked_step(ckpts: CheckpointDir, ckpt: Path) -> None:
    """verify() of a step that is absent or has no marker is CheckpointNotFoundError."""
    with pytest.raises(CheckpointNotFoundError):
        ckpts.verify(6)
    os.unlink(ckpt / MARKER)
    with pytest.raises(CheckpointNotFoundError, match="mark-complete"):
        ckpts.verify(5)
