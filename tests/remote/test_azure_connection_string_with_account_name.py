"""storage_options holding both a connection_string and an account_name, as adlfs users
pass them (adlfs connects with the connection string first): attack s15-atk33 on issue 33,
Azurite."""

from __future__ import annotations

from pathlib import Path

import pytest
from _emulators import AZURITE_ACCOUNT, Emulator

from atomic_ckpt.remote import RemoteCheckpointDir


def test_a_connection_string_with_an_account_name_beside_it_is_used(
    az_server: Emulator, tmp_path: Path
) -> None:
    """The connection string (with its key and endpoint) is used, as adlfs uses it."""
    options = {"connection_string": az_server.connection_string(), "account_name": AZURITE_ACCOUNT}
    rdir = RemoteCheckpointDir(
        f"az://{az_server.new_bucket()}/run",
        storage_options=options,
        staging_dir=tmp_path / "staging",
    )
    with rdir.commit(1) as path:
        (path / "w.bin").write_bytes(b"w" * 100)
    assert rdir.steps() == [1]


def test_an_account_name_contradicting_the_connection_string_is_a_value_error(
    az_server: Emulator, tmp_path: Path
) -> None:
    """An account_name other than the connection string's AccountName is refused by name."""
    options = {"connection_string": az_server.connection_string(), "account_name": "other"}
    with pytest.raises(ValueError, match="account_name 'other' is not the connection string"):
        RemoteCheckpointDir(
            f"az://{az_server.new_bucket()}/run",
            storage_options=options,
            staging_dir=tmp_path / "staging",
        ).steps()
