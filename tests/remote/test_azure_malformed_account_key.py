"""An Azure account key that is not valid base64 (a truncated copy-paste of the key),
given as account_key or inside a connection string (attack s15-atk33 on issue 33,
Azurite): a refused credential, said in one line, never an AttributeError."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _emulators import AZURITE_ACCOUNT, AZURITE_KEY, Emulator

from atomic_ckpt.cli import main
from atomic_ckpt.remote import RemoteCheckpointDir

TRUNCATED = AZURITE_KEY[:-2]  # the key without its trailing "==": not valid base64


def _options(az_server: Emulator, form: str) -> dict[str, Any]:
    if form == "connection_string":
        return {"connection_string": az_server.connection_string(key=TRUNCATED)}
    return {
        "endpoint_url": f"{az_server.endpoint}/{AZURITE_ACCOUNT}",
        "account_name": AZURITE_ACCOUNT,
        "account_key": TRUNCATED,
    }


@pytest.mark.parametrize("form", ["account_key", "connection_string"])
def test_a_malformed_account_key_is_a_permission_error(
    az_server: Emulator, tmp_path: Path, form: str
) -> None:
    """A key the client cannot sign with is a PermissionError naming the credentials."""
    rdir = RemoteCheckpointDir(
        f"az://{az_server.new_bucket()}/run",
        storage_options=_options(az_server, form),
        staging_dir=tmp_path / "staging",
    )
    with pytest.raises(PermissionError, match="credentials"):
        rdir.steps()


@pytest.mark.parametrize("command", ["ls", "latest", "clean"])
def test_the_cli_exits_2_in_one_line_on_a_malformed_account_key(
    az_server: Emulator, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """ls, latest and clean exit 2 with one line on stderr for a malformed key."""
    url = f"az://{az_server.new_bucket()}/run"
    options = json.dumps(_options(az_server, "account_key"))
    try:
        code = main([command, url, "--storage-options", options])
    except Exception as exc:  # a traceback, for a user
        pytest.fail(f"atomic-ckpt {command} raised {type(exc).__name__}: {exc}")
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1, err
