"""A manifest over 8 MiB (google-cloud-storage's multipart limit: the size of ~40,000
entries) with the clients' own limits, nothing patched: on fake-gcs-server, which ignores
ifGenerationMatch on the resumable upload such a manifest goes by, the probe refuses the
commit before anything is uploaded; on Azurite (a single Put Blob up to 64 MiB) of two
writers of a new step exactly one wins, and a replace from a stale base loses."""

from __future__ import annotations

from pathlib import Path

import pytest
from _emulators import Emulator, fast_root

from atomic_ckpt import StepConflictError
from atomic_ckpt.remote import UnsupportedStoreError

LINKS = 2300
TARGET = f"{'a' * 200}/" * 19
"""A symlink's target of ~3,800 bytes: 2,300 of them make a manifest of ~9 MiB, which
40,000 entries of ordinary names would (and these remove fast, unlike 40,000 dirs)."""


def _large(path: Path, seed: int) -> None:
    (path / "w").write_bytes(b"writer %d" % seed)
    (path / "links").mkdir()
    for i in range(LINKS):
        (path / "links" / f"{i:05d}").symlink_to(f"{TARGET}{i}")


@pytest.mark.slow  # ~20 s: thousands of links staged, walked and removed
def test_a_gcs_manifest_over_8_mib_is_refused_where_its_precondition_is_ignored(
    gs_server: Emulator, tmp_path: Path
) -> None:
    """Both writers of a new step are refused (UnsupportedStoreError naming the resumable
    upload), no step is visible and nothing is left in the bucket."""
    url = f"gs://{gs_server.new_bucket()}/run"
    first, second = (fast_root(gs_server, url, tmp_path / f"w{i}") for i in (1, 2))
    handles = [first.begin(1), second.begin(1)]
    for seed, handle in enumerate(handles):
        _large(handle.path, seed)
    for handle in handles:
        with pytest.raises(UnsupportedStoreError, match="resumable uploads"):
            handle.publish()
    assert first.steps() == []
    assert first._store.find("") == {}


@pytest.mark.slow  # ~50 s: four such commits and a fetch
def test_an_azure_manifest_over_8_mib_has_one_winner_and_replaces_by_its_etag(
    az_server: Emulator, tmp_path: Path
) -> None:
    """Two writers of a new step: one commits, one gets StepConflictError; a replace from
    the winner's ETag commits, one from that stale ETag then loses; the step reads back
    with every entry."""
    url = f"az://{az_server.new_bucket()}/run"
    first, second = (fast_root(az_server, url, tmp_path / f"w{i}") for i in (1, 2))
    handles = [first.begin(1), second.begin(1)]
    for seed, handle in enumerate(handles):
        _large(handle.path, seed)
    won = handles[0].publish()
    with pytest.raises(StepConflictError, match="another writer"):
        handles[1].publish()
    assert len(first._store.get("1/checkpoint_complete")[0]) > 8 << 20  # type: ignore[index]
    replacing, stale = first.begin(1), second.begin(1)  # both from the winner's ETag
    for seed, handle in ((3, replacing), (4, stale)):
        _large(handle.path, seed)
    again = replacing.publish()
    with pytest.raises(StepConflictError):
        stale.publish()
    got = second.get(1)
    assert got.attempt == again.attempt != won.attempt
    assert len(got.manifest.files) == LINKS + 2
    fetched = second.fetch(1, tmp_path / "got").path
    assert (fetched / "w").read_bytes() == b"writer 3"
    assert (fetched / "links" / "00007").readlink() == Path(f"{TARGET}7")
