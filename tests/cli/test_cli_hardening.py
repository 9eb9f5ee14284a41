"""The command line takes a step as ``ls`` shows it in a prefixed root, and
``mark-complete --require`` refuses a directory missing a file, naming it."""

from __future__ import annotations

from pathlib import Path

from atomic_ckpt import CheckpointDir
from atomic_ckpt.cli import main


def test_rm_in_a_prefixed_root_takes_the_step_as_ls_shows_it(tmp_path: Path, capsys) -> None:
    """`rm ROOT 5 --prefix checkpoint-` deletes step 5, which `ls` shows as 5."""
    ckpts = CheckpointDir(tmp_path / "run", prefix="checkpoint-")
    with ckpts.commit(5) as path:
        (path / "model.pt").write_bytes(b"w")
    assert main(["ls", str(ckpts.root), "--prefix", "checkpoint-"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[0] == "5"
    assert main(["rm", str(ckpts.root), "5", "--prefix", "checkpoint-"]) == 0
    assert "removed step 5" in capsys.readouterr().out
    assert ckpts.steps() == []


def test_mark_complete_require_refuses_naming_the_missing_file(tmp_path: Path, capsys) -> None:
    """`mark-complete --require A B` with B missing exits 1 naming B, and adopts nothing."""
    path = tmp_path / "run" / "3"
    path.mkdir(parents=True)
    (path / "model.json").write_text("{}")
    argv = ["mark-complete", str(path), "--require", "model.json", "optimizer.pt"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "optimizer.pt" in err
    assert "missing" in err
    assert CheckpointDir(tmp_path / "run").steps() == []
    (path / "optimizer.pt").write_bytes(b"w")
    assert main(argv) == 0
    assert CheckpointDir(tmp_path / "run").steps() == [3]


def test_rm_of_a_prefixed_directory_name_reports_the_step(tmp_path: Path, capsys) -> None:
    """`rm ROOT checkpoint-6 --prefix checkpoint-` says it removed step 6, as `ls` names it
    (it said "removed step checkpoint-6")."""
    ckpts = CheckpointDir(tmp_path / "run", prefix="checkpoint-")
    with ckpts.commit(6) as path:
        (path / "model.pt").write_bytes(b"w")
    assert main(["rm", str(ckpts.root), "checkpoint-6", "--prefix", "checkpoint-"]) == 0
    assert capsys.readouterr().out.startswith("removed step 6: ")
    assert ckpts.steps() == []
