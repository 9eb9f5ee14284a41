"""``atomic_ckpt.remote.open`` given a bucket URL that went through ``pathlib.Path`` (an
argparse ``type=Path`` flag: ``Path("gs://b/run")`` is ``gs:/b/run``): attack s15-atk33 on
issue 33, fake-gcs-server. Checkpoints meant for a bucket must never land silently in a
local directory named ``gs:``."""

from __future__ import annotations

from pathlib import Path

import pytest
from _emulators import Emulator

import atomic_ckpt.remote
from atomic_ckpt.cli import main
from atomic_ckpt.remote import RemoteCheckpointDir


@pytest.mark.parametrize("form", ["Path", "single-slash str"])
def test_a_url_with_its_double_slash_collapsed_is_not_a_local_directory(
    gs_server: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """It opens the bucket or is refused with a ValueError; nothing is written locally."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gs_server.endpoint)
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.chdir(tmp_path)
    url = f"gs://{gs_server.new_bucket()}/run"
    name = Path(url) if form == "Path" else url.replace("://", ":/")
    try:
        root = atomic_ckpt.remote.open(name)
    except ValueError:
        return  # refused: the user is told
    if isinstance(root, RemoteCheckpointDir):
        return
    with root.commit(1) as path:
        (path / "w.bin").write_bytes(b"w")
    assert not (tmp_path / "gs:").exists(), f"checkpoints went to a local directory: {root}"


@pytest.mark.parametrize("scheme", ["s3", "s3a", "gs", "gcs", "az", "abfs", "memory", "file"])
def test_every_known_scheme_collapsed_is_a_value_error_naming_the_double_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str
) -> None:
    """open() and RemoteCheckpointDir refuse scheme:/x/run, naming the '//' and the fix."""
    monkeypatch.chdir(tmp_path)
    name = str(Path(f"{scheme}://bucket-1/run"))
    assert name == f"{scheme}:/bucket-1/run"  # what pathlib makes of it
    with pytest.raises(ValueError, match=f"'//' was collapsed.*{scheme}://bucket-1/run"):
        atomic_ckpt.remote.open(name)
    with pytest.raises(ValueError, match="'//' was collapsed"):
        RemoteCheckpointDir(name, staging_dir=tmp_path / "staging")
    assert list(tmp_path.iterdir()) == []


def test_a_local_directory_named_like_a_scheme_is_opened_when_written_with_dot_slash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """./gs:/b/run is a local root, as the refusal's message says, and a drive-like C:/x too."""
    monkeypatch.chdir(tmp_path)
    for name in ("./gs:/b/run", "C:/x"):
        root = atomic_ckpt.remote.open(name)
        assert not isinstance(root, RemoteCheckpointDir)
        with root.commit(1) as path:
            (path / "w.bin").write_bytes(b"w")
        assert root.steps() == [1]


@pytest.mark.parametrize("command", ["ls", "latest", "verify", "prune", "clean", "rm"])
def test_the_cli_refuses_a_collapsed_url_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """atomic-ckpt COMMAND gs:/b/run exits 2 naming the collapsed '//', touching nothing local."""
    monkeypatch.chdir(tmp_path)
    extra = {"prune": ["--keep-last", "1"], "rm": ["1"]}.get(command, [])
    code = main([command, "gs:/bucket-1/run", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "'//' was collapsed" in err
    assert "gs://bucket-1/run" in err
    assert list(tmp_path.iterdir()) == []
