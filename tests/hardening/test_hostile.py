"""A checkpoint root is untrusted input: a hostile entry spoils itself at most, never the rest."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from atomic_ckpt import (
    BEST_LINK,
    MARKER,
    CheckpointDir,
    CheckpointNotFoundError,
    VerificationError,
)
from atomic_ckpt.cli import main


def _commit(ckpts: CheckpointDir, step: int, files: dict[str, bytes] | None = None) -> Path:
    with ckpts.commit(step) as path:
        for rel, data in (files or {"model.bin": b"weights"}).items():
            (path / rel).parent.mkdir(parents=True, exist_ok=True)
            (path / rel).write_bytes(data)
    return ckpts.path_of(step)


def _edit_manifest(ckpts: CheckpointDir, step: int, edit: Callable[[dict[str, Any]], None]) -> None:
    """Rewrite ``step``'s marker after ``edit`` changed its JSON document."""
    marker = ckpts.path_of(step) / MARKER
    doc = json.loads(marker.read_text())
    edit(doc)
    marker.write_text(json.dumps(doc))  # ensure_ascii: a lone surrogate stays a \\ud800 escape


# ---------------------------------------------------------------- hostile markers

DEPTH = 100_000
DEEP_MARKERS = {
    "nested-list": b"[" * DEPTH + b"]" * DEPTH,
    "nested-metadata": (
        b'{"format": "atomic_ckpt", "version": 1, "step": 2, "files": [], "metadata": {"x": '
        + b"[" * DEPTH
        + b"]" * DEPTH
        + b"}}"
    ),
}


@pytest.fixture(params=sorted(DEEP_MARKERS))
def deep(request: pytest.FixtureRequest, ckpts: CheckpointDir) -> CheckpointDir:
    """Step 1 complete; step 2's marker is valid JSON nested 100,000 levels deep."""
    _commit(ckpts, 1)
    _commit(ckpts, 2)
    (ckpts.path_of(2) / MARKER).write_bytes(DEEP_MARKERS[request.param])
    return ckpts


def test_a_deeply_nested_marker_makes_only_its_step_incomplete(deep: CheckpointDir) -> None:
    """latest(), steps() and get() treat a deeply nested marker as one incomplete step."""
    assert deep.steps() == [1]
    latest = deep.latest()
    assert latest is not None
    assert latest.step == 1
    with pytest.raises(CheckpointNotFoundError):
        deep.get(2)


def test_cli_survives_a_deeply_nested_marker(
    deep: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ls`, `latest` and `verify` exit as usual beside a deeply nested marker."""
    root = str(deep.root)
    assert main(["ls", root]) == 0
    assert main(["ls", root, "--json"]) == 0
    capsys.readouterr()
    assert main(["latest", root]) == 0
    assert capsys.readouterr().out.strip() == str(deep.path_of(1))
    assert main(["verify", root]) == 0
    assert "step 1: ok" in capsys.readouterr().out


_LATEST_UNDER_A_MEMORY_LIMIT = """
    import resource
    import sys

    from atomic_ckpt import CheckpointDir
    from atomic_ckpt.cli import main

    limit = 1 << 30  # 1 GiB of address space: far less than the 4 GiB marker
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    ckpts = CheckpointDir(sys.argv[1])
    latest = ckpts.latest()
    print(latest.step if latest else None, ckpts.steps(), flush=True)
    sys.exit(main(["ls", sys.argv[1]]))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and sparse files: Linux")
def test_a_huge_marker_is_not_read_whole(ckpts: CheckpointDir) -> None:
    """A 4 GiB (sparse) marker makes its step incomplete without being read into memory."""
    _commit(ckpts, 1)
    _commit(ckpts, 2)
    os.truncate(ckpts.path_of(2) / MARKER, 4 << 30)
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_LATEST_UNDER_A_MEMORY_LIMIT), str(ckpts.root)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "1 [1]"


# ---------------------------------------------------------------- hostile manifests


def test_ls_survives_a_size_beyond_float_range(
    ckpts: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest file size of 10**400 (a JSON integer) is listed by `ls`: no OverflowError."""
    _commit(ckpts, 1)
    _commit(ckpts, 2)

    def huge(doc: dict[str, Any]) -> None:
        doc["files"][0]["size"] = 10**400

    _edit_manifest(ckpts, 2, huge)
    assert main(["ls", str(ckpts.root)]) == 0
    listed = {line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]}
    assert listed == {"1", "2"}


def _lone_surrogate(doc: dict[str, Any]) -> None:
    doc["files"].append({"path": "\ud800", "type": "file", "size": 1})


def test_verify_of_a_lone_surrogate_path_is_a_checkpoint_error(ckpts: CheckpointDir) -> None:
    """A manifest path holding a lone surrogate fails verify() with a checkpoint error."""
    _commit(ckpts, 2)
    _edit_manifest(ckpts, 2, _lone_surrogate)
    with pytest.raises((VerificationError, CheckpointNotFoundError)):
        ckpts.verify(2)


def test_cli_verify_reports_healthy_steps_beside_a_lone_surrogate_path(
    ckpts: CheckpointDir, capsys: pytest.CaptureFixture[str]
) -> None:
    """`verify` of every step reports the healthy ones even when one manifest holds a surrogate."""
    _commit(ckpts, 1)
    _commit(ckpts, 2)
    _edit_manifest(ckpts, 2, _lone_surrogate)
    status = main(["verify", str(ckpts.root)])
    captured = capsys.readouterr()
    assert status in (0, 1), captured.err
    assert "step 1: ok" in captured.out


# ---------------------------------------------------------------- very deep trees

TREE_DEPTH = 1000


def _remove_iteratively(top: Path) -> None:
    """Remove a tree of any depth without recursion (pytest's own cleanup would recurse)."""
    if not os.path.lexists(top):
        return
    stack: list[tuple[str, bool]] = [(str(top), False)]
    while stack:
        path, emptied = stack.pop()
        if emptied:
            os.rmdir(path)
        elif stat.S_ISDIR(os.lstat(path).st_mode):
            stack.append((path, True))
            stack += [(entry.path, False) for entry in os.scandir(path)]
        else:
            os.unlink(path)


@pytest.fixture
def deep_root(tmp_path: Path) -> Iterator[CheckpointDir]:
    """A CheckpointDir whose trees, however deep, are removed without recursion afterwards."""
    yield CheckpointDir(tmp_path / "ckpts")
    _remove_iteratively(tmp_path / "ckpts")


def _deep_tree(top: Path, depth: int = TREE_DEPTH) -> Path:
    """``top/d/d/.../d`` (``depth`` levels) with ``bottom.bin`` at the end; its relative path."""
    path = top
    for _ in range(depth):
        path = path / "d"
        path.mkdir()
    (path / "bottom.bin").write_bytes(b"at the bottom")
    return path.relative_to(top) / "bottom.bin"


def test_a_1000_deep_tree_commits_and_verifies(deep_root: CheckpointDir) -> None:
    """A legal tree 1,000 directories deep is committed, recorded and verified."""
    with deep_root.commit(1) as path:
        bottom = _deep_tree(path)
    ckpt = deep_root.verify(1)
    assert bottom.as_posix() in {e.path for e in ckpt.manifest.files}
    assert (ckpt.path / bottom).read_bytes() == b"at the bottom"


def test_a_1000_deep_checkpoint_is_removed_by_prune(deep_root: CheckpointDir) -> None:
    """prune() removes a checkpoint holding a tree 1,000 directories deep."""
    old = _commit(deep_root, 1)
    _deep_tree(old)  # deepened after the commit: removal alone is under test
    _commit(deep_root, 2)
    assert deep_root.prune(keep_last=1) == [old]
    assert not os.path.lexists(old)
    assert deep_root.steps() == [2]


class SaveFailed(Exception):
    """The error a save function raises in these tests."""


def _fail_after_writing_a_deep_tree(ckpts: CheckpointDir) -> None:
    with ckpts.commit(1) as path:
        _deep_tree(path)
        raise SaveFailed


def test_a_failing_save_of_a_deep_tree_raises_its_own_error_and_leaves_nothing(
    deep_root: CheckpointDir,
) -> None:
    """A save that fails after writing a 1,000-deep tree raises its error; its staging dir goes."""
    _commit(deep_root, 0)
    before = set(os.listdir(deep_root.root))
    with pytest.raises(SaveFailed):
        _fail_after_writing_a_deep_tree(deep_root)
    assert set(os.listdir(deep_root.root)) == before
    assert deep_root.steps() == [0]


# ---------------------------------------------------------------- absurd step numbers

ABSURD = 10**300
"""A step whose directory name (301 digits) is longer than any file name may be."""


def test_best_ignores_a_link_to_an_absurd_step(ckpts: CheckpointDir) -> None:
    """checkpoint_best naming a 301-digit step is no best checkpoint, not ENAMETOOLONG."""
    _commit(ckpts, 1)
    os.symlink(str(ABSURD), ckpts.root / BEST_LINK)
    assert ckpts.best() is None


def test_prune_survives_a_best_link_to_an_absurd_step(ckpts: CheckpointDir) -> None:
    """prune() works when checkpoint_best names a 301-digit step."""
    old = _commit(ckpts, 1)
    _commit(ckpts, 2)
    os.symlink(str(ABSURD), ckpts.root / BEST_LINK)
    assert ckpts.prune(keep_last=1) == [old]
    assert ckpts.steps() == [2]


def test_get_of_an_absurd_step_is_not_found(ckpts: CheckpointDir) -> None:
    """get() of a step whose name is too long for the filesystem raises CheckpointNotFoundError."""
    _commit(ckpts, 1)
    with pytest.raises(CheckpointNotFoundError):
        ckpts.get(ABSURD)


# ---------------------------------------------------------------- entries added after the commit

EXTRAS = {
    "file": "extra.bin",
    "dir": "extra_dir/",
    "nested-file": "sub/extra.bin",
    "nested-dir": "sub/extra_dir/",
}


@pytest.mark.parametrize("extra", EXTRAS.values(), ids=EXTRAS.keys())
def test_verify_reports_entries_added_after_the_commit(ckpts: CheckpointDir, extra: str) -> None:
    """verify() fails, naming it, when a file or directory was added to a committed checkpoint."""
    path = _commit(ckpts, 1, {"model.bin": b"weights", "sub/optim.bin": b"optimizer"})
    ckpts.verify(1)  # the marker itself is no extra entry
    if extra.endswith("/"):
        (path / extra).mkdir()
    else:
        (path / extra).write_bytes(b"added later")
    with pytest.raises(VerificationError, match="extra"):
        ckpts.verify(1)
