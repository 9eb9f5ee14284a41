"""Every remote command of the CLI (``ls``, ``latest``, ``verify``, ``fetch``, ``clean``,
``prune``, ``rm``) on a gs:// or az:// root it cannot use: a bucket (container) that does
not exist, credentials that are refused, an endpoint nothing answers on. Each exits 2
(an error, never 1 "nothing there" or 0) with one line on stderr saying which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _emulators import AZURITE_ACCOUNT, Emulator, free_port

from atomic_ckpt.cli import main

COMMANDS = {
    "ls": [],
    "latest": [],
    "verify": ["1"],
    "fetch": ["1", "DEST"],
    "clean": ["--grace", "0"],
    "prune": ["--keep-last", "1"],
    "rm": ["1", "--force"],
}
WRONG_KEY = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5LXdyb25nLWtleQ=="


def _options(emulator: Emulator, fault: str, tmp: Path) -> dict[str, Any]:
    """storage_options that reach ``emulator`` with ``fault``."""
    if fault == "wrong-endpoint":
        endpoint = f"http://127.0.0.1:{free_port()}"
        if emulator.scheme == "gs":
            return {"endpoint_url": endpoint, "connect_retries": 0}
        return {
            "account_name": AZURITE_ACCOUNT,
            "account_key": WRONG_KEY,
            "endpoint_url": f"{endpoint}/{AZURITE_ACCOUNT}",
            "connect_retries": 0,
        }
    if fault == "bad-credentials":
        if emulator.scheme == "gs":  # fake-gcs-server checks none: a key file that is none
            bad = tmp / "not-a-key.json"
            bad.write_text('{"type": "service_account"}')
            return {"endpoint_url": emulator.endpoint, "token": str(bad)}
        return {"connection_string": emulator.connection_string(key=WRONG_KEY)}
    return emulator.options()


@pytest.mark.parametrize("fault", ["missing-bucket", "bad-credentials", "wrong-endpoint"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_root_the_cli_cannot_use_exits_2_in_one_line(
    emulator: Emulator,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    fault: str,
) -> None:
    """The command exits 2 with one line naming the bucket, the credentials or the endpoint."""
    bucket = "t-no-such-bucket-here" if fault == "missing-bucket" else emulator.new_bucket()
    url = f"{emulator.scheme}://{bucket}/run"
    options = _options(emulator, fault, tmp_path)
    args = [a.replace("DEST", str(tmp_path / "dest")) for a in COMMANDS[command]]
    status = main([command, url, *args, "--storage-options", json.dumps(options)])
    captured = capsys.readouterr()
    assert status == 2, (status, captured.out, captured.err)
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith("atomic-ckpt: error: "), captured.err
    said = captured.err.lower()
    if fault == "missing-bucket":
        noun = "container" if emulator.scheme == "az" else "bucket"
        assert f"{noun} 't-no-such-bucket-here' does not exist" in captured.err
    elif fault == "bad-credentials":
        assert "credentials" in said or "access denied" in said, captured.err
    else:
        assert "cannot connect to http://127.0.0.1:" in captured.err, captured.err
    assert not (tmp_path / "dest").exists()
