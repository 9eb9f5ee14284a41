"""``clean`` (the API and ``atomic-ckpt clean``) on a gs:// or az:// root while one writer
process is alive, paused after its listing check right before its manifest write, and two
others were SIGKILLed (after their listing check, and part-way through their uploads):
no partial step is visible, the old checkpoint stays, ``clean`` with the default grace
removes nothing, ``clean --dry-run`` only names what it would remove, and ``clean --grace``
shorter than the killed attempts' age removes exactly those and never the live one, which
then commits whole."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _emulators import Emulator, env_without_cloud, fast_root
from _remote_support import read_tree, write_tree

from atomic_ckpt.cli import main

CHILD = Path(__file__).resolve().parent / "_cloud_child.py"
BIG = (5 << 20) + 4321
GRACE = 5.0
"""Seconds: younger than the killed attempts when ``clean`` runs, older than the live one's
(Azure's Last-Modified is in whole seconds: a second's margin)."""


def _child(
    emulator: Emulator, url: str, seed: int, tmp: Path, *extra: str
) -> subprocess.Popen[str]:
    argv = [sys.executable, str(CHILD), url, json.dumps(emulator.options()), "2", str(seed)]
    argv += ["--big", str(BIG), "--staging", str(tmp / f"staging-{seed}"), *extra]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_without_cloud()
    )


def _attempts(rdir: object, step: int) -> dict[str, set[str]]:
    """attempt -> the file paths under it, of step ``step``."""
    found: dict[str, set[str]] = {}
    for key in rdir._store.find(f"{step}/"):  # type: ignore[attr-defined]
        parts = key.split("/", 2)
        if len(parts) == 3:
            found.setdefault(parts[1], set()).add(parts[2])
    return found


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    status = main(list(args))
    return status, capsys.readouterr().out.splitlines()


def test_clean_collects_killed_attempts_and_never_the_live_one(
    emulator: Emulator, cloud_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Killed attempts older than --grace are removed (staged blocks too); the live
    writer's attempt is kept, it commits afterwards, and nothing else is left."""
    rdir = fast_root(emulator, cloud_url, tmp_path)
    with rdir.commit(1) as path:
        old = write_tree(path, 1)
    counting = _child(emulator, cloud_url + "-count", 2, tmp_path)
    out, err = counting.communicate(timeout=300)
    assert counting.returncode == 0, err[-2000:]
    total = json.loads(out)["requests"]  # the last request is the manifest write
    killed = []
    for seed, before in ((3, total), (4, total - 3)):  # after the listing; mid-upload
        log = tmp_path / f"kill-{seed}.log"
        proc = _child(
            emulator, cloud_url, seed, tmp_path, "--kill-before", str(before), "--log", str(log)
        )
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == -9, err[-2000:]
        assert log.read_text().splitlines()[-1] == f"KILL before request {before}"
        killed.append(time.monotonic())
    dead = set(_attempts(rdir, 2))
    assert len(dead) == 2, dead
    while time.monotonic() - killed[-1] < GRACE + 1:  # the killed attempts age
        time.sleep(0.1)
    paused, resume = tmp_path / "paused", tmp_path / "resume"
    live = _child(
        emulator,
        cloud_url,
        2,
        tmp_path,
        *("--pause-before", str(total), "--paused", str(paused), "--resume", str(resume)),
    )
    try:
        while not paused.exists():
            assert live.poll() is None, live.communicate()
            time.sleep(0.01)
        live_attempt = set(_attempts(rdir, 2)) - dead
        assert len(live_attempt) == 1, live_attempt
        assert rdir.steps() == [1]
        opts = ["--storage-options", json.dumps(emulator.options())]
        assert _cli(capsys, "latest", cloud_url, *opts) == (0, [rdir.url_of(1)])
        before = set(rdir._store.find(""))
        assert rdir.clean() == []  # the default grace: one hour
        assert _cli(capsys, "clean", cloud_url, *opts) == (0, ["nothing to clean"])
        assert set(rdir._store.find("")) == before
        dry = _cli(capsys, "clean", cloud_url, "--dry-run", "--grace", str(GRACE), *opts)
        assert dry == (0, sorted(f"would remove {rdir.url_of(2)}/{a}/" for a in dead)), dry
        assert set(rdir._store.find("")) == before
        status, lines = _cli(capsys, "clean", cloud_url, "--grace", str(GRACE), *opts)
        assert status == 0
        assert sorted(lines) == sorted(f"removed {rdir.url_of(2)}/{a}/" for a in dead), lines
        left = _attempts(rdir, 2)
        assert set(left) == live_attempt
        assert rdir._store.live_uploads("") == {}  # the killed writer's staged blocks too
        assert rdir.steps() == [1]
        resume.touch()
        out, err = live.communicate(timeout=300)
    finally:
        resume.touch()
        if live.poll() is None:
            live.kill()
    assert live.returncode == 0, err[-2000:]
    assert json.loads(out)["attempt"] in live_attempt
    assert rdir.steps() == [1, 2]
    assert read_tree(rdir.fetch(1, tmp_path / "got-1").path) == old
    assert read_tree(rdir.fetch(2, tmp_path / "got-2").path) == write_tree(
        tmp_path / "x", 2, big=BIG
    )
    assert _cli(capsys, "clean", cloud_url, "--grace", "0", *opts) == (0, ["nothing to clean"])
