"""The temporary names of a root (PROTOCOL.md, step 1): the design's ``N.tmp-<hex>`` in a
plain root, the hidden ``.tmp-<prefix>N.<hex>`` where a prefix is set; both recognised
everywhere as temporary; names that no temporary-name pattern could match are refused."""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path

import pytest
from treeutil import write

from atomic_ckpt import TMP_INFIX, CheckpointDir
from atomic_ckpt._core.l1_names import names
from atomic_ckpt._core.l1_names.names import ROOT_LOCK, parse_tmp
from atomic_ckpt._core.l2_syscalls import fs as _fs

HEX = "[0-9a-f]{32}"
PREFIXES = pytest.mark.parametrize("prefix", ["", "checkpoint-"], ids=["plain", "prefixed"])


def staging_re(prefix: str, name: str, tag: str = "") -> re.Pattern[str]:
    """The staging (or aside) name PROTOCOL.md gives ``name`` in a root with ``prefix``."""
    if prefix:
        return re.compile(rf"\.tmp-{re.escape(name)}\.{tag}{HEX}")
    return re.compile(rf"{re.escape(name)}\.tmp-{tag}{HEX}")


def tmp_entries(root: Path) -> list[str]:
    return sorted(n for n in os.listdir(root) if TMP_INFIX in n and n != ROOT_LOCK)


# ---------------------------------------------------------------- the names written


@PREFIXES
def test_a_commit_stages_under_the_roots_form_with_its_lock_beside(
    tmp_path: Path, prefix: str
) -> None:
    """Plain root: ``5.tmp-<hex>/`` and its ``.lock``; prefixed: ``.tmp-checkpoint-5.<hex>``."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    with ckpts.commit(5) as path:
        assert staging_re(prefix, f"{prefix}5").fullmatch(path.name), path.name
        assert tmp_entries(ckpts.root) == sorted([path.name, path.name + ".lock"])
    assert tmp_entries(ckpts.root) == []
    assert ckpts.steps() == [5]


@PREFIXES
def test_a_named_commit_stages_under_the_roots_form(tmp_path: Path, prefix: str) -> None:
    """commit_named("best") stages as ``best.tmp-<hex>`` (plain) or ``.tmp-best.<hex>``."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    with ckpts.commit_named("best") as path:
        assert staging_re(prefix, "best").fullmatch(path.name), path.name
        assert (ckpts.root / (path.name + ".lock")).is_file()
    assert tmp_entries(ckpts.root) == []


@PREFIXES
def test_deletes_the_fallback_and_links_use_the_roots_form(
    tmp_path: Path, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delete aside (``N.tmp-del-<hex>``), the fallback's old copy (``N.tmp-old-<hex>``)
    and the temporary names of aliases and the best pointer follow the root's form."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    renamed: list[str] = []
    linked: list[str] = []
    real_rename, real_symlink = _fs.rename, _fs.symlink_replace

    def rename(src: Path, dst: Path) -> None:
        if TMP_INFIX in Path(dst).name:  # (a link's own rename lands on its final name)
            renamed.append(Path(dst).name)
        real_rename(src, dst)

    def symlink_replace(target: str, link: Path, tmp: Path) -> None:
        linked.append(Path(tmp).name)
        real_symlink(target, link, tmp)

    def no_exchange(a: Path, b: Path) -> None:
        raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")

    monkeypatch.setattr(_fs, "rename", rename)
    monkeypatch.setattr(_fs, "symlink_replace", symlink_replace)
    monkeypatch.setattr(_fs, "rename_exchange", no_exchange)
    name = f"{prefix}1"
    with ckpts.commit(1, aliases=["first"]) as path:
        write(path, {"a": b"1"})
    with ckpts.commit(1) as path:  # a replace through the fallback
        write(path, {"a": b"2"})
    ckpts.set_best(1)
    with ckpts.commit(2) as path:
        write(path, {"a": b"3"})
    ckpts.delete(2)
    assert staging_re(prefix, name, "old-").fullmatch(renamed[0]), renamed
    assert staging_re(prefix, f"{prefix}2", "del-").fullmatch(renamed[-1]), renamed
    assert staging_re(prefix, "first").fullmatch(linked[0]), linked
    assert staging_re(prefix, "checkpoint_best").fullmatch(linked[1]), linked
    assert tmp_entries(ckpts.root) == []


def test_the_root_lock_keeps_its_name(
    ckpts: CheckpointDir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The root lock is ``.atomic_ckpt.tmp-root.lock`` in every root, held only while used."""
    assert ROOT_LOCK == ".atomic_ckpt.tmp-root.lock"
    seen: list[bool] = []
    real = _fs.rename_noreplace

    def spy(src: Path, dst: Path) -> None:
        seen.append((ckpts.root / ROOT_LOCK).exists())
        real(src, dst)

    monkeypatch.setattr(_fs, "rename_noreplace", spy)
    with ckpts.commit(1):
        pass
    assert seen == [True]
    assert not (ckpts.root / ROOT_LOCK).exists()


def test_the_two_forms_parse_alike_and_never_overlap() -> None:
    """Each form parses to its name, tag and token, keeps its form in its siblings, and
    a name of one form never parses as the other."""
    token = "ab" * 16
    plain = parse_tmp(f"checkpoint-5.tmp-del-{token}.lock")
    hidden = parse_tmp(f".tmp-checkpoint-5.del-{token}.lock")
    assert plain is not None
    assert hidden is not None
    for parsed in (plain, hidden):
        assert (parsed.name, parsed.tag, parsed.token, parsed.is_lock) == (
            "checkpoint-5",
            "del-",
            token,
            True,
        )
    assert (plain.hidden, hidden.hidden) == (False, True)
    assert plain.sibling() == f"checkpoint-5.tmp-{token}"
    assert hidden.sibling("old-") == f".tmp-checkpoint-5.old-{token}"
    assert plain.lock() == f"checkpoint-5.tmp-{token}.lock"
    assert names.tmp_name("7", token, hidden=False) == f"7.tmp-{token}"
    assert names.tmp_name("7", token, hidden=True) == f".tmp-7.{token}"
    assert names.hidden_tmp("") is False
    assert names.hidden_tmp("checkpoint-") is True


# ---------------------------------------------------------------- both forms recognised


def _orphans(root: Path, prefix: str, real: Path) -> list[str]:
    """A killed writer's leftovers in both forms: staging dirs (marked, so complete-looking),
    a delete aside, and their lock files, which tell clean() that the library made them."""
    t1, t2, t3, t4 = ("1" * 32, "2" * 32, "3" * 32, "4" * 32)
    made = [
        f"{prefix}2.tmp-{t1}",
        f".tmp-{prefix}3.{t2}",
        f"{prefix}4.tmp-del-{t3}",
        f".tmp-{prefix}6.del-{t4}",
    ]
    for name in made:
        shutil.copytree(real, root / name)
    locks = [f"{prefix}2.tmp-{t1}.lock", f".tmp-{prefix}3.{t2}.lock"]
    locks += [f"{prefix}4.tmp-{t3}.lock", f".tmp-{prefix}6.{t4}.lock"]
    for name in locks:
        (root / name).write_bytes(b"")
    return sorted(made + locks)


@PREFIXES
def test_the_scanner_and_clean_know_both_forms_in_any_root(tmp_path: Path, prefix: str) -> None:
    """Whichever form a root writes, staging of either form is never a step, is listed as
    staging with its step, and clean() removes it with its lock files."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    with ckpts.commit(1) as path:
        write(path, {"a": b"1"})
    orphans = _orphans(ckpts.root, prefix, ckpts.path_of(1))
    assert ckpts.steps() == [1]
    assert ckpts.latest() is not None
    assert ckpts.latest().step == 1
    staging = [e for e in ckpts.entries(include_staging=True) if e.status == "staging"]
    assert sorted(e.step for e in staging) == [2, 3, 4, 6]
    removed = ckpts.clean()
    assert sorted(p.name for p in removed) == orphans
    assert tmp_entries(ckpts.root) == []
    assert ckpts.steps() == [1]


@PREFIXES
def test_clean_force_removes_lockless_leftovers_of_both_forms(tmp_path: Path, prefix: str) -> None:
    """Staging dirs whose lock files a power loss dropped go with clean(force=True), either form."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    with ckpts.commit(1):
        pass
    lockless = sorted([f"{prefix}5.tmp-{'5' * 32}", f".tmp-{prefix}5.{'6' * 32}"])
    for name in lockless:
        (ckpts.root / name).mkdir()
    assert ckpts.clean() == []
    assert sorted(p.name for p in ckpts.clean(force=True)) == lockless


# ---------------------------------------------------------------- names no pattern could match

BAD = ["val\nloss", "tab\there", "nul\x00", "bell\x07", "del\x7f", "line\u2028sep"]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_name_with_a_control_character_is_refused_before_anything_is_written(
    ckpts: CheckpointDir, bad: str
) -> None:
    """commit_named, an alias (commit, commit_named) and promote_named refuse a name with a
    newline or other control character, saying which characters are allowed."""
    with pytest.raises(ValueError, match="printable"), ckpts.commit_named(bad):
        pass
    with pytest.raises(ValueError, match="printable"), ckpts.commit(1, aliases=[bad]):
        pass
    with pytest.raises(ValueError, match="printable"), ckpts.commit_named("ok", aliases=[bad]):
        pass
    with pytest.raises(ValueError, match="printable"):
        ckpts.promote_named(bad, 1)
    assert not ckpts.root.exists() or tmp_entries(ckpts.root) == []


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_prefix_with_a_control_character_is_refused(tmp_path: Path, bad: str) -> None:
    """CheckpointDir(prefix="ckpt\\n") is a ValueError naming the allowed characters."""
    with pytest.raises(ValueError, match="printable"):
        CheckpointDir(tmp_path / "ckpts", prefix=bad)


def test_printable_names_with_spaces_and_unicode_stay_allowed(ckpts: CheckpointDir) -> None:
    """Spaces, punctuation and non-ASCII letters are printable: still fine as names."""
    for name in ["val loss", "épreuve=1", "best_ckpt-v2.0"]:
        with ckpts.commit_named(name) as path:
            write(path, {"a": b"x"})
        assert ckpts.get_named(name).path == ckpts.root / name
    assert tmp_entries(ckpts.root) == []


@PREFIXES
def test_leftovers_with_a_newline_in_their_name_are_still_temporary(
    tmp_path: Path, prefix: str
) -> None:
    """What an older version left for a name with a newline is parsed as temporary in both
    forms: clean(force=True) removes it (and clean() with its lock file)."""
    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    ckpts.root.mkdir()
    (ckpts.root / f"val\nloss.tmp-{'7' * 32}").mkdir()
    (ckpts.root / f"val\nloss.tmp-{'7' * 32}.lock").write_bytes(b"")
    (ckpts.root / f".tmp-val\nloss.{'8' * 32}").mkdir()
    assert parse_tmp(f".tmp-val\nloss.{'8' * 32}") is not None
    assert len(ckpts.clean()) == 2
    assert [p.name for p in ckpts.clean(force=True)] == [f".tmp-val\nloss.{'8' * 32}"]
    assert os.listdir(ckpts.root) == []


@PREFIXES
def test_the_cli_lists_and_cleans_both_forms(
    tmp_path: Path, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`atomic-ckpt ls` shows leftovers of both forms as staging; `clean` removes them."""
    from atomic_ckpt.cli import main

    ckpts = CheckpointDir(tmp_path / "ckpts", prefix=prefix)
    with ckpts.commit(1) as path:
        write(path, {"a": b"1"})
    orphans = _orphans(ckpts.root, prefix, ckpts.path_of(1))
    args = [str(ckpts.root), "--prefix", prefix]
    assert main(["ls", *args, "--json"]) == 0
    listed = capsys.readouterr().out
    for name in orphans:
        if not name.endswith(".lock"):
            assert name in listed, (name, listed)
    assert main(["clean", *args]) == 0
    out = capsys.readouterr().out
    assert all(f"removed {ckpts.root / name}" in out for name in orphans), out
    assert tmp_entries(ckpts.root) == []
