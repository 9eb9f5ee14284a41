"""``atomic-ckpt`` with an s3:// root (moto over HTTP): ls, latest, verify, prune, clean,
fetch; endpoint and credentials from --storage-options and the environment."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _remote_support import S3, read_tree, write_tree

from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli import main
from atomic_ckpt.remote import RemoteCheckpointDir


@pytest.fixture
def populated(remote: RemoteCheckpointDir) -> RemoteCheckpointDir:
    """Steps 1, 2 and 3 complete, and an uncommitted attempt of step 4."""
    for step in (1, 2, 3):
        with remote.commit(step, metadata={"loss": 1.0 / step}) as path:
            write_tree(path, step)
    from atomic_ckpt.remote import _store

    src = Path(remote._staging_dir or ".") / "orphan.bin"
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_bytes(b"half an upload")
    remote._store.upload([_store.Upload(src, f"4/{'a' * 32}/model.bin", 14)])
    return remote


def _opts(s3: S3) -> list[str]:
    return ["--storage-options", json.dumps({"endpoint_url": s3.endpoint})]


def test_ls_latest_verify(populated: RemoteCheckpointDir, s3_server: S3, capsys) -> None:
    """ls shows complete and uncommitted steps; latest prints the URL; verify checks all."""
    url = populated.url
    assert main(["ls", url, *_opts(s3_server), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["step"], r["status"]) for r in rows] == [
        (1, "complete"),
        (2, "complete"),
        (3, "complete"),
        (4, "uncommitted"),
    ]
    assert main(["ls", url, *_opts(s3_server)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:2] == ["STEP", "STATUS"]
    assert out[-1].split()[:2] == ["4", "uncommitted"]
    assert main(["latest", url, *_opts(s3_server)]) == 0
    assert capsys.readouterr().out.strip() == f"{url}/3"
    assert main(["verify", url, *_opts(s3_server)]) == 0
    assert capsys.readouterr().out.splitlines() == [f"step {s}: ok" for s in (1, 2, 3)]
    assert main(["verify", url, "7", *_opts(s3_server)]) == 1
    assert "FAILED" in capsys.readouterr().out


def test_prune_clean_fetch(
    populated: RemoteCheckpointDir, s3_server: S3, tmp_path: Path, capsys
) -> None:
    """prune deletes old steps, clean --grace 0 removes the uncommitted attempt, fetch
    downloads a step that then verifies locally."""
    url = populated.url
    assert main(["prune", url, "--keep-last", "2", *_opts(s3_server)]) == 0
    assert capsys.readouterr().out.strip() == f"deleted {url}/1"
    assert main(["clean", url, "--dry-run", *_opts(s3_server)]) == 0
    assert capsys.readouterr().out.strip() == "nothing to clean"  # younger than the grace
    assert main(["clean", url, "--grace", "0", *_opts(s3_server)]) == 0
    assert capsys.readouterr().out.strip() == f"removed {url}/4/{'a' * 32}/"
    dest = tmp_path / "out" / "3"
    assert main(["fetch", url, "3", str(dest), *_opts(s3_server)]) == 0
    assert capsys.readouterr().out.strip() == str(dest)
    assert read_tree(dest) == write_tree(tmp_path / "expected", 3)
    assert CheckpointDir(dest.parent).verify(3).step == 3
    assert main(["fetch", url, "3", str(dest), *_opts(s3_server)]) == 2
    assert "exists" in capsys.readouterr().err


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
def test_a_missing_bucket_exits_2_not_1(
    s3_server: S3, tmp_path: Path, capsys, command: list[str]
) -> None:
    """verify/ls/latest/fetch on a bucket that does not exist exit 2 (an error) with one line
    saying the bucket does not exist, not 1 ("no such checkpoint") or 0 ("no checkpoints")."""
    url = "s3://t-no-such-bucket-here/run"
    args = [a.replace("DEST", str(tmp_path / "dest")) for a in command]
    assert main([args[0], url, *args[1:], *_opts(s3_server)]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert "bucket 't-no-such-bucket-here' does not exist" in captured.err
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
