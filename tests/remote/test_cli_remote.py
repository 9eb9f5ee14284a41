"""``atomic-ckpt`` with an s3:// root (moto over HTTP), a gs:// one (fake-gcs-server) and an
az:// one (Azurite): ls, latest, verify, prune, clean, fetch, rm; endpoint and credentials
from --storage-options and the environment."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _emulators import Emulator
from _remote_support import S3, read_tree, write_tree

from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli import main
from atomic_ckpt.remote import RemoteCheckpointDir


@dataclass(frozen=True)
class Root:
    """A root on one of the stores, and the --storage-options that reach it."""

    rdir: RemoteCheckpointDir
    options: dict[str, Any]

    @property
    def opts(self) -> list[str]:
        return ["--storage-options", json.dumps(self.options)]


@pytest.fixture(params=["s3", "gs", "az"])
def root(request: pytest.FixtureRequest) -> Root:
    """A fresh root on S3, GCS and Azure in turn."""
    if request.param == "s3":
        s3: S3 = request.getfixturevalue("s3_server")
        return Root(request.getfixturevalue("remote"), {"endpoint_url": s3.endpoint})
    emulator: Emulator = request.getfixturevalue(f"{request.param}_server")
    url = f"{request.param}://{emulator.new_bucket()}/run"
    return Root(RemoteCheckpointDir(url, storage_options=emulator.options()), emulator.options())


@pytest.fixture
def populated(root: Root, tmp_path: Path) -> RemoteCheckpointDir:
    """Steps 1, 2 and 3 complete, and an uncommitted attempt of step 4."""
    remote = root.rdir
    for step in (1, 2, 3):
        with remote.commit(step, metadata={"loss": 1.0 / step}) as path:
            write_tree(path, step)
    from atomic_ckpt.remote import _store

    src = tmp_path / "orphan.bin"  # never the working directory (the repository)
    src.write_bytes(b"half an upload")
    remote._store.upload([_store.Upload(src, f"4/{'a' * 32}/model.bin", 14)])
    return remote


def _opts(s3: S3) -> list[str]:
    return ["--storage-options", json.dumps({"endpoint_url": s3.endpoint})]


def test_ls_latest_verify(populated: RemoteCheckpointDir, root: Root, capsys) -> None:
    """ls shows complete and uncommitted steps; latest prints the URL; verify checks all."""
    url = populated.url
    assert main(["ls", url, *root.opts, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["status"]) for r in rows] == [
        (1, "complete"),
        (2, "complete"),
        (3, "complete"),
        (4, "uncommitted"),
    ]
    assert main(["ls", url, *root.opts]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["STEP", "STATUS"]
    assert out[-1].split()[:2] == ["4", "uncommitted"]
    assert main(["latest", url, *root.opts]) == 0
    assert capsys.readouterr().out.strip() == f"{url}/3"
    assert main(["verify", url, *root.opts]) == 0
    assert capsys.readouterr().out.splitlines() == [f"step {s}: ok" for s in (1, 2, 3)]
    assert main(["verify", url, "7", *root.opts]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_prune_clean_fetch(
    populated: RemoteCheckpointDir, root: Root, tmp_path: Path, capsys
) -> None:
    """prune deletes old steps, clean --grace 0 removes the uncommitted attempt, fetch
    downloads a step that then verifies locally."""
    url = populated.url
    assert main(["prune", url, "--keep-last", "2", *root.opts]) == 0
    assert capsys.readouterr().out.strip() == f"deleted {url}/1"
    assert main(["clean", url, "--dry-run", *root.opts]) == 0
    assert capsys.readouterr().out.strip() == "nothing to clean"  # younger than the grace
    assert main(["clean", url, "--grace", "0", *root.opts]) == 0
    assert capsys.readouterr().out.strip() == f"removed {url}/4/{'a' * 32}/"
    dest = tmp_path / "out" / "3"
    assert main(["fetch", url, "3", str(dest), *root.opts]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    assert read_tree(dest) == write_tree(tmp_path / "expected", 3)
    assert CheckpointDir(dest.parent).verify(3).step == 3
    assert main(["fetch", url, "3", str(dest), *root.opts]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["rm", url, "3", *root.opts]) == 0
    assert populated.steps() == [2]


def test_errors_are_one_line(s3_server: S3, capsys) -> None:
    """A missing bucket, a bad --storage-options and an unsupported URL each print one
    line and exit 2."""
    assert main(["ls", "s3://no-such-bucket-here/x", *_opts(s3_server)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(SystemExit):
        main(["ls", "s3://b/x", "--storage-options", "[1]"])
    capsys.readouterr()
    assert main(["ls", "file:///tmp/x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "ROOT is a local directory" in err


@pytest.mark.parametrize(
    "command", [["verify", "3"], ["verify"], ["ls"], ["latest"], ["fetch", "3", "DEST"]]
)
@pytest.mark.parametrize("scheme", ["s3", "gs", "az"])
def test_a_missing_bucket_exits_2_not_1(
    request: pytest.FixtureRequest, tmp_path: Path, capsys, command: list[str], scheme: str
) -> None:
    """verify/ls/latest/fetch on a bucket (container) that does not exist exit 2 (an error)
    with one line saying so, not 1 ("no such checkpoint") or 0 ("no checkpoints")."""
    server = request.getfixturevalue(f"{scheme}_server")
    options = {"endpoint_url": server.endpoint} if scheme == "s3" else server.options()
    url = f"{scheme}://t-no-such-bucket-here/run"
    args = [a.replace("DEST", str(tmp_path / "dest")) for a in command]
    assert main([args[0], url, *args[1:], "--storage-options", json.dumps(options)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    noun = "container" if scheme == "az" else "bucket"
    assert f"{noun} 't-no-such-bucket-here' does not exist" in captured.err
    assert "no complete checkpoint" not in captured.out + captured.err


def test_verify_and_fetch_print_every_problem(
    remote: RemoteCheckpointDir, s3_server: S3, tmp_path: Path, capsys
) -> None:
    """verify URL STEP on a checkpoint with three damaged objects prints the verdict and each
    problem on its own line; fetch's error names all three too; neither names a Python
    attribute."""
    with remote.commit(3) as path:
        write_tree(path, 3)
    ckpt = remote.get(3)
    damaged = ["meta.json", "model.bin", "optim/state.bin"]
    for rel in damaged:
        entry = next(e for e in ckpt.manifest.files if e.path == rel)
        src = tmp_path / "bad"
        src.write_bytes(b"\0" * entry.size)  # the same size: complete, but not these bytes
        from atomic_ckpt.remote import _store

        remote._store.upload([_store.Upload(src, f"3/{ckpt.attempt}/{rel}", entry.size)])
    assert main(["verify", remote.url, "3", *_opts(s3_server)]) == 1
    out = capsys.readouterr().out
    assert ".problems" not in out
    lines = out.splitlines()
    assert lines[0] == "step 3: FAILED (3 problems)"
    assert [line.split(":")[0] for line in lines[1:]] == [f"  {rel}" for rel in damaged]
    assert main(["fetch", remote.url, "3", str(tmp_path / "dest"), *_opts(s3_server)]) == 2
    err = capsys.readouterr().err
    assert ".problems" not in err
    assert err.startswith("atomic-ckpt: error: ")
    assert [rel for rel in damaged if f"{rel}: checksum is" in err] == damaged
    assert len(err.splitlines()) == 3
    assert not (tmp_path / "dest").exists()


def test_bad_storage_options_exit_2_in_one_line(s3_server: S3, capsys) -> None:
    """--storage-options that s3fs refuses (an unknown option) exit 2 with one line naming
    the flag, not a traceback and status 1 ("nothing there")."""
    opts = json.dumps({"endpoint_url": s3_server.endpoint, "no_such_option": 1})
    assert main(["ls", "s3://b/x", "--storage-options", opts]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--storage-options was refused" in err
