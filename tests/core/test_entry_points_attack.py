"""Issue 30, the same classes attacked again from outside: every commit entry point takes a
step the way ``CheckpointDir.commit`` does (a bool is no step, on every path), and
``rank0_commit`` blocks of one step open in two threads at once are two whole saves:
neither one's end loses the other (each commits whole, the last to promote wins)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from treeutil import contents

from atomic_ckpt import CheckpointDir, InvalidStepError
from atomic_ckpt.distributed import distributed_commit, rank0_commit

Entry = Callable[[CheckpointDir, object], AbstractContextManager[object]]
ENTRIES: dict[str, Entry] = {
    "commit": lambda c, s: c.commit(s),  # type: ignore[arg-type]
    "begin": lambda c, s: c.begin(s),  # type: ignore[arg-type]
    "rank0_commit": rank0_commit,  # type: ignore[dict-item]
    "rank0_commit(join=True)": lambda c, s: rank0_commit(c, s, join=True),  # type: ignore[arg-type]
    "distributed_commit": distributed_commit,  # type: ignore[dict-item]
}


@pytest.mark.parametrize("step", [True, False], ids=["True", "False"])
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_no_commit_entry_point_takes_a_bool_for_a_step(
    tmp_path: Path, entry: str, step: bool
) -> None:
    """``rank0_commit(ckpts, True)`` committed step 1 (and ``False`` step 0) where
    ``commit(True)`` is an InvalidStepError (a ValueError): a flag passed in the step's
    place is refused on every entry point, before anything is staged."""
    c = CheckpointDir(tmp_path / "ckpts")
    with (
        pytest.raises(InvalidStepError, match="non-negative int, got bool") as caught,
        ENTRIES[entry](c, step),
    ):
        pass
    assert isinstance(caught.value, ValueError)
    assert c.steps() == []
    assert not (tmp_path / "ckpts").exists() or list((tmp_path / "ckpts").iterdir()) == []


def test_rank0_commits_of_one_step_in_two_threads_both_end_whole(tmp_path: Path) -> None:
    """Thread A opens ``rank0_commit(c, 5)``; thread B opens its own (no join) while A's is
    open, and ends after A. B's save used to end in a KeyError (A's end had removed the
    record of B's block), aborting B's save: each block now ends as a commit of its own,
    B's promoted last, so step 5 holds B's files whole."""
    c = CheckpointDir(tmp_path / "ckpts")
    b_open, a_ended = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def b() -> None:
        try:
            with rank0_commit(c, 5) as path:
                assert path is not None
                (path / "b.bin").write_bytes(b"B" * 10)
                b_open.set()
                a_ended.wait(60)
        except BaseException as exc:  # reported below
            errors.append(exc)
            b_open.set()

    thread = threading.Thread(target=b)
    with rank0_commit(c, 5) as path:
        assert path is not None
        (path / "a.bin").write_bytes(b"A" * 10)
        thread.start()
        assert b_open.wait(60)
    assert contents(tmp_path / "ckpts" / "5") == {"a.bin": b"A" * 10}
    a_ended.set()
    thread.join(60)
    assert errors == []
    assert c.steps() == [5]
    assert contents(tmp_path / "ckpts" / "5") == {"b.bin": b"B" * 10}
    c.verify(5)


def test_save_state_with_carry_frozen_and_the_dcp_writer_refuse_a_bool_step(
    tmp_path: Path,
) -> None:
    """``save_state(ckpts, True, carry_frozen=True)`` committed step 1 and
    ``AtomicWriter(ckpts, True)`` took it as step 1, where ``save_state`` without the
    option refused it: both are InvalidStepError now, and nothing is committed."""
    torch = pytest.importorskip("torch")
    from atomic_ckpt.dcp import AtomicWriter
    from atomic_ckpt.torch import save_state

    c = CheckpointDir(tmp_path / "ckpts")
    model = torch.nn.Linear(2, 2)
    model.bias.requires_grad_(False)
    for flag in (False, True):
        with pytest.raises(InvalidStepError, match="got bool"):
            save_state(c, True, model=model, carry_frozen=flag)
    with pytest.raises(InvalidStepError, match="got bool"):
        AtomicWriter(c, True)
    assert c.steps() == []


def test_write_state_refuses_a_bool_like_step(tmp_path: Path) -> None:
    """``write_state(path, step=torch.tensor(True))`` (or ``step=True``) wrote
    ``"step": 1`` into the training state a resume then trusts: it is an
    InvalidStepError, as for every commit, and nothing is written."""
    torch = pytest.importorskip("torch")
    from atomic_ckpt.torch import write_state

    for flag in (True, torch.tensor(True)):
        with pytest.raises(InvalidStepError, match="non-negative int"):
            write_state(tmp_path, step=flag, model=torch.nn.Linear(2, 2))
    assert list(tmp_path.iterdir()) == []


def test_check_contents_of_a_step_that_is_not_there_names_it(tmp_path: Path) -> None:
    """``check_contents(7)`` with no directory 7 raised a bare ``[Errno 2]`` about the path;
    it is a CheckpointNotFoundError (a FileNotFoundError) naming the step and the root."""
    from atomic_ckpt import CheckpointNotFoundError

    c = CheckpointDir(tmp_path / "ckpts")
    with c.commit(1) as path:
        (path / "a.json").write_text("{}")
    with pytest.raises(CheckpointNotFoundError, match="step 7") as caught:
        c.check_contents(7)
    assert isinstance(caught.value, FileNotFoundError)
    assert [f.path for f in c.check_contents(1)] == ["a.json"]
