"""Power-loss simulation of whole workloads: I1 to I4 hold in every crash state.

Hypothesis chooses the workload (earlier checkpoints, legacy directories, how
many commits of which steps, new or replacing, files of what sizes in which
subdirectories, adoptions, prunes, the prefix, the checksum, exchange or the
move-aside fallback); the simulation then checks every crash point under the
three crash models, or (second test) Hypothesis chooses the crash point and
exactly which unsynced operations survive.
"""

from __future__ import annotations

from typing import Literal

from crash_stats import CrashStats
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import Workload, examples, workloads

from atomic_ckpt import CheckpointDir
from atomic_ckpt.testing import DataFate, explore, record

Replace = Literal["exchange", "aside"]


def _settings(default_examples: int) -> settings:
    return settings(
        max_examples=examples(default_examples),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


@_settings(80)
@given(
    workload=workloads(),
    replace=st.sampled_from(["exchange", "aside"]),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_crash_state_keeps_the_invariants(
    crash_stats: CrashStats, workload: Workload, replace: Replace, seed: int
) -> None:
    """At every operation boundary, under strict, ext4-like and subset models, I1-I4 hold."""
    report = explore(
        workload.save,
        setup=workload.setup,
        replace=replace,
        prefix=workload.prefix,
        checksum=workload.checksum,
        samples=8,
        seed=seed,
    )
    crash_stats.add(report)
    assert report.states_checked > 0
    assert report.ok, str(report)


@_settings(100)
@given(workload=workloads(max_actions=2), data=st.data())
def test_a_chosen_crash_state_keeps_the_invariants(
    crash_stats: CrashStats, workload: Workload, data: st.DataObject
) -> None:
    """Hypothesis picks where the crash falls, which unsynced ops survive and how their data."""
    with record(
        workload.save, setup=workload.setup, prefix=workload.prefix, checksum=workload.checksum
    ) as rec:
        for _ in range(3):
            k = data.draw(st.integers(0, len(rec.ops)), label="crash point")
            loose = rec.uncovered(k)
            kept = data.draw(st.sets(st.sampled_from(loose)) if loose else st.just(set()))
            fates: dict[int, DataFate] = {
                i: data.draw(st.sampled_from(["kept", "zero", "torn"]), label=f"fate of #{i}")
                for i in sorted(kept)
                if rec.ops[i].kind == "data"
            }
            failure = rec.check(k, persisted=kept, fates=fates)
            crash_stats.chosen_states += 1
            assert failure is None, str(failure)


def test_fallback_replace_twice_never_restores_the_older_copy() -> None:
    """Regression (found by the test above): after two move-aside replaces, a crash in the
    second one's window must not leave the first one's removed old copy to be restored."""

    def save(ckpts: CheckpointDir) -> None:
        for tag in (b"new", b"newer"):
            with ckpts.commit(0) as path:
                (path / "model.bin").write_bytes(tag)

    def setup(ckpts: CheckpointDir) -> None:
        with ckpts.commit(0) as path:
            (path / "model.bin").write_bytes(b"old")

    report = explore(save, setup=setup, replace="aside", keep_going=True)
    assert report.ok, str(report)
