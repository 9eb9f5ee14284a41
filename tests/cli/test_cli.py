"""The ``atomic-ckpt`` command line: output, JSON and exit statuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli import main

TOKEN = "0123456789abcdef0123456789abcdef"


def _commit(ckpts: CheckpointDir, step: int, payload: bytes = b"data") -> None:
    with ckpts.commit(step) as path:
        (path / "weights.bin").write_bytes(payload)


@pytest.fixture
def populated(ckpts: CheckpointDir) -> CheckpointDir:
    """Steps 1 and 2 complete, 3 unmarked, and an orphaned staging dir of 4."""
    _commit(ckpts, 1)
    _commit(ckpts, 2, b"x" * 3000)
    (ckpts.root / "3").mkdir()
    (ckpts.root / "3" / "weights.bin").write_bytes(b"partial")
    (ckpts.root / f"4.tmp-{TOKEN}").mkdir()
    (ckpts.root / f"4.tmp-{TOKEN}.lock").write_bytes(b"")  # its dead writer's lock file
    return ckpts


def test_ls_lists_complete_unmarked_and_staging(populated: CheckpointDir, capsys) -> None:
    """`ls` shows every step with its status, file count and size."""
    assert main(["ls", str(populated.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:5] == ["STEP", "STATUS", "FILES", "SIZE", "CREATED"]
    status = {line.split()[0]: line.split()[1] for line in out[1:]}
    assert status == {"1": "complete", "2": "complete", "3": "unmarked", "4": "staging"}


def test_ls_json_is_machine_readable(populated: CheckpointDir, capsys) -> None:
    """`ls --json` prints one object per entry with step, status, files, size, created, path."""
    assert main(["ls", str(populated.root), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_step = {r["step"]: r for r in rows}
    assert by_step[2]["status"] == "complete"
    assert by_step[2]["files"] == 1
    assert by_step[2]["size"] == 3000
    assert by_step[3]["status"] == "unmarked"
    assert by_step[4]["status"] == "staging"
    assert {"created", "path"} <= by_step[1].keys()


def test_ls_missing_root_exits_1(tmp_path: Path, capsys) -> None:
    """`ls` on a root that does not exist says so and exits 1, creating nothing."""
    root = tmp_path / "nope"
    assert main(["ls", str(root)]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert not root.exists()


def test_latest_prints_newest_complete_path(populated: CheckpointDir, capsys) -> None:
    """`latest` prints the newest complete checkpoint, skipping unmarked and staging dirs."""
    assert main(["latest", str(populated.root)]) == 0
    assert capsys.readouterr().out.strip() == str(populated.root / "2")
    assert main(["latest", str(populated.root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"step": 2, "path": str(populated.root / "2")}


def test_latest_exits_1_when_there_is_none(ckpts: CheckpointDir, capsys) -> None:
    """`latest` exits 1 with nothing on stdout when there is no complete checkpoint."""
    ckpts.root.mkdir()
    (ckpts.root / "7").mkdir()
    assert main(["latest", str(ckpts.root)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no complete checkpoint" in captured.err


def test_verify_passes_then_names_the_corrupt_file(populated: CheckpointDir, capsys) -> None:
    """`verify` exits 0 on intact checkpoints and 1 naming the first bad file otherwise."""
    assert main(["verify", str(populated.root)]) == 0
    assert "step 2: ok" in capsys.readouterr().out
    (populated.root / "2" / "weights.bin").write_bytes(b"y" * 3000)
    assert main(["verify", str(populated.root), "2", "--json"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert result["ok"] is False
    assert "weights.bin" in result["error"]
    assert "checksum" in result["error"]


def test_verify_of_an_unmarked_step_fails(populated: CheckpointDir, capsys) -> None:
    """`verify ROOT 3` on an unmarked dir fails and says how to adopt it."""
    assert main(["verify", str(populated.root), "3"]) == 1
    assert "mark-complete" in capsys.readouterr().out


def test_clean_removes_orphans_and_dry_run_keeps_them(populated: CheckpointDir, capsys) -> None:
    """`clean --dry-run` only reports; `clean` removes the orphaned staging dir."""
    orphan = populated.root / f"4.tmp-{TOKEN}"
    assert main(["clean", str(populated.root), "--dry-run"]) == 0
    assert f"would remove {orphan}" in capsys.readouterr().out
    assert orphan.exists()
    assert main(["clean", str(populated.root)]) == 0
    assert f"removed {orphan}" in capsys.readouterr().out
    assert not orphan.exists()
    assert populated.steps() == [1, 2]


def test_mark_complete_adopts_a_legacy_dir(populated: CheckpointDir, capsys) -> None:
    """`mark-complete PATH` makes an unmarked step visible and verifiable."""
    assert main(["mark-complete", str(populated.root / "3")]) == 0
    assert "marked" in capsys.readouterr().out
    fresh = CheckpointDir(populated.root)
    assert fresh.steps() == [1, 2, 3]
    fresh.verify(3)


def test_mark_complete_with_prefix(tmp_path: Path, capsys) -> None:
    """`mark-complete --prefix checkpoint-` parses the step after the prefix."""
    legacy = tmp_path / "checkpoint-40"
    legacy.mkdir()
    (legacy / "a").write_text("a")
    assert main(["mark-complete", str(legacy)]) == 2
    assert "--prefix" in capsys.readouterr().err
    assert main(["mark-complete", "--prefix", "checkpoint-", str(legacy)]) == 0
    assert CheckpointDir(tmp_path, prefix="checkpoint-").steps() == [40]


def test_errors_are_one_line_without_traceback(tmp_path: Path) -> None:
    """A bad root (a plain file) gives one stderr line and exit status 2, never a traceback."""
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    for argv in (["ls", str(not_a_dir)], ["mark-complete", str(tmp_path / "missing" / "5")]):
        proc = subprocess.run(
            [sys.executable, "-m", "atomic_ckpt.cli", *argv],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert proc.stderr.startswith("atomic-ckpt: error:")


def test_demo_survives_a_kill_mid_save(tmp_path: Path) -> None:
    """`atomic-ckpt demo DIR` kills its trainer mid-save, resumes and ends bit-identical."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-m", "atomic_ckpt.cli", "demo", str(tmp_path / "demo"), "--steps", "5"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SIGKILL sent" in proc.stdout
    assert "bit-identical" in proc.stdout
    assert CheckpointDir(tmp_path / "demo" / "checkpoints").steps() == [1, 2, 3, 4, 5]


def test_ls_survives_a_hostile_manifest_timestamp(ckpts: CheckpointDir, capsys) -> None:
    """A manifest whose creation time is absurd (1e300) is listed, never a traceback."""
    _commit(ckpts, 1)
    marker = ckpts.root / "1" / "checkpoint_complete"
    doc = json.loads(marker.read_text())
    doc["created"] = 1e300
    marker.write_text(json.dumps(doc))
    assert main(["ls", str(ckpts.root)]) == 0
    assert "complete" in capsys.readouterr().out


def test_prune_local_root(populated: CheckpointDir, capsys) -> None:
    """`prune --keep-last 1` deletes all but the newest complete step of a local root."""
    assert main(["prune", str(populated.root), "--keep-last", "1"]) == 0
    assert capsys.readouterr().out.strip() == f"deleted {populated.root / '1'}"
    assert populated.steps() == [2]
    assert main(["prune", str(populated.root), "--keep-last", "1"]) == 0
    assert capsys.readouterr().out.strip() == "nothing to delete"


def test_url_only_options_are_refused_for_a_local_root(populated: CheckpointDir, capsys) -> None:
    """fetch, --grace and --storage-options need a URL root: one line, exit 2."""
    root = str(populated.root)
    assert main(["fetch", root, "1", str(populated.root.parent / "out")]) == 2
    assert "URL" in capsys.readouterr().err
    assert main(["clean", root, "--grace", "0"]) == 2
    assert "URL" in capsys.readouterr().err
    assert main(["ls", root, "--storage-options", "{}"]) == 2
    assert "URL" in capsys.readouterr().err


def test_verify_prints_every_problem_under_the_verdict(ckpts: CheckpointDir, capsys) -> None:
    """`verify ROOT STEP` on a checkpoint with three bad files prints the verdict, then each
    problem on its own line (no Python attribute names); --json lists the same three."""
    with ckpts.commit(5) as path:
        for name in ("a.bin", "b.bin", "c.bin", "d.bin"):
            (path / name).write_bytes(name.encode() * 100)
    for name in ("a.bin", "c.bin"):
        (ckpts.root / "5" / name).write_bytes(b"x" * 500)  # same size, other bytes
    (ckpts.root / "5" / "d.bin").unlink()
    assert main(["verify", str(ckpts.root), "5"]) == 1
    out = capsys.readouterr().out
    assert ".problems" not in out
    lines = out.splitlines()
    assert lines[0] == "step 5: FAILED (3 problems)"
    assert [line.split(":")[0] for line in lines[1:]] == [
        f"  {ckpts.root / '5' / name}" for name in ("a.bin", "c.bin", "d.bin")
    ]
    assert "checksum" in lines[1]
    assert "missing" in lines[3]
    assert main(["verify", str(ckpts.root), "5", "--json"]) == 1
    [result] = json.loads(capsys.readouterr().out)
    assert [p.strip() for p in result["problems"]] == [line.strip() for line in lines[1:]]


def test_cli_messages_name_no_python_internals(ckpts: CheckpointDir, capsys) -> None:
    """No message of the command line names a Python attribute, exception class or repr."""
    with ckpts.commit(1) as path:
        (path / "a").write_bytes(b"a")
        (path / "b").write_bytes(b"b")
    (ckpts.root / "1" / "a").unlink()
    (ckpts.root / "1" / "b").unlink()
    for argv in (
        ["verify", str(ckpts.root)],
        ["verify", str(ckpts.root), "9"],
        ["latest", str(ckpts.root / "nope")],
        ["prune", str(ckpts.root), "--keep-last", "0"],
        ["mark-complete", str(ckpts.root / "x")],
    ):
        main(argv)
        captured = capsys.readouterr()
        text = captured.out + captured.err
        for pythonism in (".problems", "Error(", "Traceback", "None", "self.", "keep_last"):
            assert pythonism not in text, (argv, text)
    assert main(["prune", str(ckpts.root), "--keep-last", "0"]) == 2
    assert "--keep-last must be at least 1" in capsys.readouterr().err
    (ckpts.root / "4").mkdir()
    (ckpts.root / "4" / "only").write_bytes(b"x")
    assert main(["mark-complete", str(ckpts.root / "4")]) == 0
    assert "complete (1 entry)" in capsys.readouterr().out
