"""``atomic_ckpt.remote.open`` given a bucket URL that went through ``pathlib.Path`` (an
argparse ``type=Path`` flag: ``Path("gs://b/run")`` is ``gs:/b/run``): attack s15-atk33 on
issue 33, fake-gcs-server. Checkpoints meant for a bucket must never land silently in a
local directory named ``gs:``."""

from __future__ import annotations

from pathlib import Path

import pytest
from _emulators import Emulator

import atomic_ckpt.remote
from atomic_ckpt.remote import RemoteCheckpointDir


@pytest.mark.xfail(
    strict=True,
    reason="open(Path('gs://b/run')) silently opens a local CheckpointDir at ./gs:/b/run",
)
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
