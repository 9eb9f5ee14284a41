"""Joined commits (issue 30): a joined block is part of the commit it joins. While any
joined block is open the commit is not published; an error in one (or a join that cannot
be made) aborts the whole commit; a join with nothing open never replaces a committed
step; a joined block's options merge into the commit it joins by one rule."""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from treeutil import contents, write

from atomic_ckpt import CheckpointDir, CommitStateError, RetentionPolicy
from atomic_ckpt.distributed import rank0_commit

Joiner = Callable[[CheckpointDir, int], AbstractContextManager[Path | None]]

JOINERS: dict[str, Joiner] = {
    "commit": lambda c, s: c.commit(s, join=True),
    "rank0_commit": lambda c, s: rank0_commit(c, s, join=True),
}
OUTERS: dict[str, Joiner] = {
    "commit": lambda c, s: c.commit(s),
    "rank0_commit": rank0_commit,
}


@pytest.fixture(
    params=[(o, j) for o in OUTERS for j in JOINERS], ids=lambda p: "-in-".join(p[::-1])
)
def pair(request: pytest.FixtureRequest) -> tuple[Joiner, Joiner]:
    """Every (outer, joiner) pair of the single-process joining paths."""
    outer, joiner = request.param
    return OUTERS[outer], JOINERS[joiner]


# ---------------------------------------------------------------- 1: an error aborts the whole


def test_a_swallowed_error_in_any_joined_block_aborts_the_outer_commit(
    ckpts: CheckpointDir, pair: tuple[Joiner, Joiner]
) -> None:
    """Half a file written in a joined block that raised is never published, whichever
    API opened the commit and whichever joined it; the outer block gets CommitStateError."""
    outer, joiner = pair
    fired = []

    def trainer_save() -> None:
        with outer(ckpts, 9) as path:
            assert path is not None
            write(path, {"a.bin": b"a"})
            try:
                with joiner(ckpts, 9) as inner:
                    assert inner == path
                    write(inner, {"half.bin": b"hal"})
                    fired.append(True)
                    raise OSError("disk full halfway on purpose")
            except OSError:
                pass  # buggy glue carries on

    with pytest.raises(CommitStateError, match="joined"):
        trainer_save()
    assert fired == [True]
    assert ckpts.steps() == []
    assert ckpts.staging(9) is None


def test_the_outer_error_names_the_joined_blocks_error(ckpts: CheckpointDir) -> None:
    """The CommitStateError at the end says why: the joined block's own error, chained."""

    def trainer_save() -> None:
        with ckpts.commit(4):
            try:
                with ckpts.commit(4, join=True):
                    raise OSError("the reason on purpose")
            except OSError:
                pass

    with pytest.raises(CommitStateError) as caught:
        trainer_save()
    assert "the reason on purpose" in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)


# ---------------------------------------------------------------- 2: joins from other threads


def test_publish_waits_for_a_block_joined_from_another_thread(ckpts: CheckpointDir) -> None:
    """The outer block ends while a writer thread's joined block is still open: the commit
    is published only once that block ended, with the whole shard in it."""
    entered, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            with ckpts.commit(3, join=True) as path:
                (path / "shard.bin").write_bytes(b"0123456789")
                entered.set()
                release.wait(30)
                with open(path / "shard.bin", "ab") as f:
                    f.write(b"0123456789")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=writer)
    with ckpts.begin(3) as commit:
        thread.start()
        assert entered.wait(30)
        # The outer block ends now; the writer goes on once publish() is waiting for it.
        threading.Timer(0.2, release.set).start()
    thread.join(30)
    assert errors == []
    assert commit.state == "published"
    assert contents(ckpts.verify(3).path) == {"shard.bin": b"0123456789" * 2}


def test_an_error_in_another_threads_joined_block_aborts_the_waiting_publish(
    ckpts: CheckpointDir,
) -> None:
    """The joiner thread fails while the outer publish waits for it: nothing is published,
    and the outer block gets CommitStateError naming the joiner's error."""
    entered, release = threading.Event(), threading.Event()
    fired = []

    def writer() -> None:
        try:
            with ckpts.commit(3, join=True) as path:
                (path / "shard.bin").write_bytes(b"01234")
                entered.set()
                release.wait(30)
                fired.append(True)
                raise OSError("shard writer failed on purpose")
        except OSError:
            pass

    def trainer_save() -> None:
        with ckpts.commit(3):
            thread.start()
            assert entered.wait(30)
            threading.Timer(0.2, release.set).start()

    thread = threading.Thread(target=writer)
    with pytest.raises(CommitStateError, match="shard writer failed on purpose"):
        trainer_save()
    thread.join(30)
    assert fired == [True]
    assert ckpts.steps() == []
    assert ckpts.staging(3) is None


def test_publish_gives_up_after_join_timeout_and_the_joiner_learns_it(
    ckpts: CheckpointDir,
) -> None:
    """A joined block still open after ``join_timeout`` seconds: publish raises
    CommitStateError and aborts; the joined block, leaving normally, raises too."""
    entered, release = threading.Event(), threading.Event()
    seen: list[BaseException] = []

    def writer() -> None:
        try:
            with ckpts.commit(3, join=True) as path:
                (path / "shard.bin").write_bytes(b"01234")
                entered.set()
                release.wait(30)
        except BaseException as exc:
            seen.append(exc)

    thread = threading.Thread(target=writer)
    commit = ckpts.begin(3)
    commit.join_timeout = 0.05
    thread.start()
    assert entered.wait(30)
    with pytest.raises(CommitStateError, match="still open"):
        commit.publish()
    release.set()
    thread.join(30)
    assert [type(e) for e in seen] == [CommitStateError]
    assert ckpts.steps() == []


def test_publish_inside_its_own_joined_block_is_refused_at_once(ckpts: CheckpointDir) -> None:
    """A thread that publishes while it holds a joined block of the same commit would wait
    for itself: CommitStateError at once, nothing published."""
    commit = ckpts.begin(2)
    with pytest.raises(CommitStateError, match="inside"), ckpts.commit(2, join=True):
        commit.publish()
    assert ckpts.steps() == []
    assert commit.state == "aborted"


# ---------------------------------------------------------------- 2, 15: joining after the end


def test_join_with_nothing_open_over_a_committed_step_is_refused_naming_amend(
    ckpts: CheckpointDir,
) -> None:
    """A one-part save called alone after its step was committed (a shard-writer thread
    that came late, the seed project's save_scheduler_state_dict) must not replace the full
    step with its one part: CommitStateError naming amend; the step is unchanged."""
    with ckpts.commit(5) as path:
        write(path, {"model.bin": b"m", "optim.bin": b"o"})
    for joiner in JOINERS.values():
        with pytest.raises(CommitStateError, match="amend"), joiner(ckpts, 5) as inner:
            raise AssertionError(f"the join yielded {inner}")
    with ckpts.commit_named("interrupted") as path:
        write(path, {"model.bin": b"n"})
    with (
        pytest.raises(CommitStateError, match="already committed"),
        ckpts.commit_named("interrupted", join=True),
    ):
        raise AssertionError("the join yielded")
    assert contents(ckpts.get_named("interrupted").path) == {"model.bin": b"n"}
    assert contents(ckpts.verify(5).path) == {"model.bin": b"m", "optim.bin": b"o"}


def test_a_thread_joining_after_the_outer_commit_ended_replaces_nothing(
    ckpts: CheckpointDir,
) -> None:
    """The late shard writer of issue 30 item 2: it gets CommitStateError, the step keeps
    every shard the outer commit published."""
    seen: list[BaseException] = []
    with ckpts.commit(6) as path:
        write(path, {"shard0.bin": b"0", "shard1.bin": b"1"})

    def late() -> None:
        try:
            with ckpts.commit(6, join=True) as p:
                write(p, {"shard1.bin": b"late"})
        except BaseException as exc:
            seen.append(exc)

    thread = threading.Thread(target=late)
    thread.start()
    thread.join(30)
    assert [type(e) for e in seen] == [CommitStateError]
    assert contents(ckpts.path_of(6)) == {"shard0.bin": b"0", "shard1.bin": b"1"}


def test_join_alone_on_a_new_step_still_commits(ckpts: CheckpointDir) -> None:
    """The save function called alone for a step nothing committed commits it itself."""
    for i, joiner in enumerate(JOINERS.values()):
        with joiner(ckpts, 10 + i) as path:
            assert path is not None
            write(path, {"model.bin": b"m"})
    assert ckpts.steps() == [10, 11]


# ---------------------------------------------------------------- 7: an alias equal to the name


def test_an_alias_equal_to_the_commits_own_name_is_refused_before_anything_changes(
    ckpts: CheckpointDir,
) -> None:
    """commit_named("x", aliases=["x"]) and begin_named: ValueError at the start, nothing
    promoted, nothing staged."""
    with (
        pytest.raises(ValueError, match="own name"),
        ckpts.commit_named("x", aliases=["x"]) as path,
    ):
        raise AssertionError(f"the commit started in {path}")
    with pytest.raises(ValueError, match="own name"):
        ckpts.begin_named("x", aliases=["x"])
    assert ckpts.named() == []
    assert not ckpts.root.exists() or list(ckpts.root.iterdir()) == []


def test_an_alias_added_later_equal_to_the_own_name_fails_before_the_promotion(
    ckpts: CheckpointDir,
) -> None:
    """An alias list changed on the handle after begin is checked again before promoting."""
    commit = ckpts.begin_named("x")
    commit.aliases.append("x")
    with pytest.raises(ValueError, match="own name"):
        commit.finish()
    assert ckpts.named() == []


# ---------------------------------------------------------------- 9: a joined block's options


def test_a_joined_blocks_options_merge_into_the_commit_it_joins(ckpts: CheckpointDir) -> None:
    """metadata keys are added, aliases appended, replace_aliases or-ed, a retain policy
    taken when the outer commit has none: retain(metric=...) sees the joined metric."""
    with ckpts.commit(1, metadata={"loss": 3.0}) as path:
        write(path, {"m": b"1"})
    with ckpts.commit(2, aliases=["old2"]) as path:
        write(path, {"m": b"2"})
    policy = RetentionPolicy(keep_best=1, metric="loss", mode="min")
    with (
        ckpts.commit(2, metadata={"epoch": 2}) as path,
        ckpts.commit(
            2,
            join=True,
            metadata={"loss": 0.5},
            aliases=["epoch2"],
            replace_aliases=True,
            retain=policy,
        ) as inner,
    ):
        write(inner, {"m": b"2b"})
    ckpt = ckpts.verify(2)
    assert ckpt.manifest.metadata == {"epoch": 2, "loss": 0.5}
    assert ckpts.aliases(2) == ["epoch2"]  # replace_aliases: old2 went
    assert ckpts.steps() == [2]  # the joined policy ran, and saw the joined metric


def test_a_joined_option_that_contradicts_the_outer_one_is_refused_naming_it(
    ckpts: CheckpointDir,
) -> None:
    """A metadata key set to another value, or another retain policy: ValueError naming the
    outer commit, and (like any failed join) the outer commit is aborted."""
    cases: list[dict[str, object]] = [
        {"metadata": {"epoch": 2}},
        {"retain": RetentionPolicy(keep_last=3)},
    ]
    refused = []

    def trainer_save(options: dict[str, object]) -> None:
        with ckpts.commit(1, metadata={"epoch": 1}, retain=RetentionPolicy(keep_last=1)):
            with (
                pytest.raises(ValueError, match="commit of step 1"),
                ckpts.commit(1, join=True, **options),  # type: ignore[arg-type]
            ):
                raise AssertionError("joined")
            refused.append(options)

    for options in cases:
        with pytest.raises(CommitStateError, match="joined"):
            trainer_save(options)
        assert ckpts.steps() == []
    assert refused == cases


def test_rank0_commit_join_merges_options_the_same_way(ckpts: CheckpointDir) -> None:
    """The single-process rank0_commit join follows ckpts.commit's rule."""
    with (
        rank0_commit(ckpts, 4, metadata={"epoch": 4}),
        rank0_commit(ckpts, 4, join=True, metadata={"val": 1.0}, aliases=["e4"]) as p,
    ):
        assert p is not None
    assert ckpts.verify(4).manifest.metadata == {"epoch": 4, "val": 1.0}
    assert ckpts.aliases(4) == ["e4"]


# ---------------------------------------------------------------- 10: joined inside an amend


def test_a_failed_join_inside_an_amend_ends_it_with_commit_state_error(
    ckpts: CheckpointDir,
) -> None:
    """amend(step) with a commit(step, join=True) inside that failed (swallowed): the amend
    raises CommitStateError, not FileNotFoundError naming its staging dir; the step keeps
    its committed files."""
    with ckpts.commit(7) as path:
        write(path, {"model.bin": b"m"})
    fired = []

    def amend_it() -> None:
        with ckpts.amend(7) as path:
            write(path, {"extra.bin": b"e"})
            try:
                with ckpts.commit(7, join=True):
                    fired.append(True)
                    raise OSError("on purpose")
            except OSError:
                pass

    with pytest.raises(CommitStateError, match="joined") as caught:
        amend_it()
    assert fired == [True]
    assert ".tmp-" not in str(caught.value).split("joined")[0]
    assert contents(ckpts.verify(7).path) == {"model.bin": b"m"}
    assert ckpts.staging(7) is None
