"""The frameworks' crash table: each save path audited, plain next to atomic_ckpt.

    python benchmarks/crash_table.py [--rows torchsave,hf,...] [--jobs 2] [--out DIR]
    python benchmarks/crash_table.py --render        # rewrite the table and chart from the JSON

For every cell, ``atomic_ckpt.testing.audit`` records the cell's workload
(``benchmarks/crash_table/<script>.py save ROOT``: a tiny model, three saves, one a
rewrite of an existing step, one failing part-way on a full disk) under strace, rebuilds
every state a crash could leave under the ``kill`` and ``power`` models, and runs the
cell's check on each: the framework's own resume path, loading the newest checkpoint
and judging it against the workload's journal (``benchmarks/crash_table/_common.py``).
The checks run as functions forked from this process (the frameworks are imported
once), ``--jobs`` at a time in private mount namespaces where that is possible.

Writes ``crash_table.json`` (per cell: distinct states and violations per model, the
kinds of violation, examples, the audit's time split and the wall time), ``crash_table.md``
and ``crash_table.png`` into ``--out`` (default ``benchmarks/results``). Exits 1 if any
"with atomic_ckpt" cell has a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "crash_table"
REPO = HERE.parent
sys.path.insert(0, str(SCRIPTS))

MODELS = ("kill", "power")


@dataclass(frozen=True)
class Cell:
    """One audited workload: a script and its flags, in a row and column of the table."""

    row: str
    column: str  # "plain" or "atomic_ckpt"
    script: str
    flags: tuple[str, ...] = ()
    variant: str = ""

    @property
    def name(self) -> str:
        return self.script + "".join(f"-{f.lstrip('-')}" for f in self.flags)


ROWS: dict[str, tuple[str, str, list[Cell]]] = {}
"""key -> (the save path, the atomic_ckpt API, its cells)."""


def _row(key: str, path: str, api: str, plain: str, atomic: str, *variants: str) -> None:
    cells = [Cell(key, "plain", plain)]
    if variants:
        for v in variants:
            flags = ("--async",) if v == "async" else ()
            cells.append(Cell(key, "atomic_ckpt", atomic, flags, v))
    else:
        cells.append(Cell(key, "atomic_ckpt", atomic))
    ROWS[key] = (path, api, cells)


_row("torchsave", "`torch.save` to the final file", "`atomic_write`", "torchsave_plain",
     "torchsave_atomic")  # fmt: skip
_row("stepdir", "files into `N/` + resume from the highest `N`", "`commit()`", "stepdir_plain",
     "stepdir_atomic")  # fmt: skip
_row("hf", "HF `Trainer` (`save_steps`, `resume_from_checkpoint=True`)", "`AtomicTrainer`",
     "hf_plain", "hf_atomic")  # fmt: skip
_row("lightning", 'Lightning `ModelCheckpoint` + `ckpt_path="last"`',
     "`AtomicCheckpointIO` (+ async)", "lightning_plain", "lightning_atomic",
     "sync", "async")  # fmt: skip
_row("hf_final", "HF `Trainer`: a script's final `save_model()` + `save_state()`, "
     "loaded with `from_pretrained`", "`AtomicTrainer`", "hf_final_plain",
     "hf_final_atomic")  # fmt: skip
_row("lightning_final", "Lightning `trainer.save_checkpoint(path)` by hand, loaded with "
     "`load_from_checkpoint`", "`AtomicCheckpointIO` (+ async)", "lightning_final_plain",
     "lightning_final_atomic", "sync", "async")  # fmt: skip
_row("dcp", "torch DCP `FileSystemWriter`", "`AtomicWriter` (sync + async)", "dcp_plain",
     "dcp_atomic", "sync", "async")  # fmt: skip
_row("dedup", "write only what changed: carry + dedup into `N/`, then delete the source",
     "`Commit.carry` + `dedup=True`", "dedup_plain", "dedup_atomic")  # fmt: skip


def _check_of(cell: Cell, scratch: Path) -> Callable[[Path], None]:
    """The cell's check as a function for the audit to fork: one verdict line, exit 1 on
    a violation.

    Warmed first: the workload runs once here, untraced, and the check resumes from what
    it left, so that every lazy import and first-call cost of the framework is paid in
    this process (each forked check would pay it again); then the heap is frozen
    (``gc.freeze``), so that a check's garbage collection (Accelerate runs
    ``gc.collect()`` at every ``train()``) neither walks nor copies this process's objects.
    """
    import contextlib
    import gc
    import importlib
    import subprocess

    import _common

    module = importlib.import_module(cell.script)
    warm = scratch / f"warm-{cell.name}"
    subprocess.run(
        [sys.executable, str(SCRIPTS / f"{cell.script}.py"), "save", str(warm), *cell.flags],
        check=True,
        capture_output=True,
        env=_env(),
    )
    # A plain cell's final state may be broken (a violation): it warms all the same.
    with (
        open(os.devnull, "w") as null,
        contextlib.redirect_stdout(null),
        contextlib.redirect_stderr(null),
        contextlib.suppress(_common.Violation),
    ):
        module.check(warm)
    gc.collect()
    gc.freeze()

    def check(root: Path) -> None:
        try:
            print(module.check(Path(root)), flush=True)
        except _common.Violation as exc:
            print(f"VIOLATION {_common.one_line(str(exc))}", flush=True)
            raise SystemExit(1) from None

    check.__name__ = f"{cell.script}.check"
    return check


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(SCRIPTS)])}


def _kind(output: str, status: int) -> str:
    """What kind of violation a check's output reports."""
    for line in output.splitlines():
        if "VIOLATION " in line:
            text = line.split("VIOLATION ", 1)[1]
            for kind in ("lost commit", "bytes of no single save"):
                if text.startswith(kind):
                    return kind
            if text.startswith(("cannot load", "cannot resume", "resume_point", "finding")):
                return "cannot load"
            return text.split(":", 1)[0]
    return "check timed out" if status == 124 else f"check failed (status {status})"


def audit_cell(cell: Cell, work: Path, *, jobs: int, max_states: int | None) -> dict[str, Any]:
    """Audit one cell; its JSON record."""
    from atomic_ckpt.testing import audit

    root = work / cell.name
    argv = [sys.executable, str(SCRIPTS / f"{cell.script}.py"), "save", str(root), *cell.flags]
    began = time.monotonic()
    check = _check_of(cell, work)
    warmed = time.monotonic() - began
    report = audit(
        argv,
        check,
        root=root,
        models=MODELS,
        jobs=jobs,
        max_states=max_states,
        timeout=300,
        env=_env(),
        progress=False,
    )
    seconds = time.monotonic() - began
    kinds = {m: Counter(_kind(v.output, v.status) for v in report.by_model(m)) for m in MODELS}
    examples = [
        {
            "model": v.model,
            "crash_point": v.crash_point,
            "operation": v.operation,
            "kind": _kind(v.output, v.status),
            "verdict": next(
                (ln.strip() for ln in v.output.splitlines() if "VIOLATION" in ln), v.output[-300:]
            ),
            "damaged": list(v.damaged),
        }
        for m in MODELS
        for v in report.by_model(m)[:3]
    ]
    return {
        "row": cell.row,
        "column": cell.column,
        "variant": cell.variant,
        "workload": " ".join(
            [f"benchmarks/crash_table/{cell.script}.py", "save", "ROOT", *cell.flags]
        ),
        "check": f"benchmarks/crash_table/{cell.script}.py check ROOT",
        "operations": report.operations,
        "calls": report.calls,
        "states": {m: report.states.get(m, 0) for m in MODELS},
        "distinct_states": {m: report.distinct.get(m, 0) for m in MODELS},
        "violations": {m: len(report.by_model(m)) for m in MODELS},
        "kinds": {m: dict(kinds[m]) for m in MODELS},
        "examples": examples,
        "sampled": report.sampled,
        "notes": list(report.notes),
        "timings": {**report.timings, "warm": warmed},
        "seconds": round(seconds, 1),
    }


# --------------------------------------------------------------------------- rendering


def _cell_text(rec: dict[str, Any]) -> str:
    parts = [f"{m} {rec['violations'][m]}/{rec['states'][m]}" for m in MODELS]
    return ", ".join(parts)


def markdown(records: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The crash table: per cell, violations / distinct states checked, per crash model."""
    out = [
        "# Crash table: every framework's save path, plain and with atomic_ckpt",
        "",
        "Each cell: **violations / distinct crash states checked**, for a process `kill` "
        "and a `power` loss (`atomic-ckpt audit`; a violation is a state whose resume, "
        "through the framework's own resume path, fails, loads bytes of no single save, "
        "or loses a save that had returned). Same tiny model, 3 saves per workload "
        "(one rewrites an existing step, one fails part-way on a full disk).",
        "",
        "| save path | plain | with atomic_ckpt |",
        "|---|---|---|",
    ]
    for key, (path, api, _cells) in ROWS.items():
        recs = [r for r in records if r["row"] == key]
        if not recs:
            continue
        plain = [r for r in recs if r["column"] == "plain"]
        atomic = [r for r in recs if r["column"] == "atomic_ckpt"]
        p = _cell_text(plain[0]) if plain else "not run"
        a = "<br>".join(
            (f"{r['variant']}: " if r["variant"] else "") + _cell_text(r) for r in atomic
        )
        out.append(f"| {path} | {p} | {api}: {a or 'not run'} |")
    out += [
        "",
        "Kinds of violation (plain cells):",
        "",
    ]
    for r in records:
        if any(r["violations"].values()):
            kinds = "; ".join(
                f"{m}: " + ", ".join(f"{n} {k}" for k, n in sorted(r["kinds"][m].items()))
                for m in MODELS
                if r["kinds"][m]
            )
            out.append(f"* `{r['workload'].split()[0].rsplit('/', 1)[1]}`: {kinds}")
    out += [
        "",
        "| cell | operations | wall time (s) | warm-up / record / build states / checks (s) |",
        "|---|---|---|---|",
    ]
    for r in records:
        t = r["timings"]
        split = " / ".join(f"{t.get(k, 0):.1f}" for k in ("warm", "record", "build", "checks"))
        name = r["workload"].split()[0].rsplit("/", 1)[1] + (
            " --async" if "--async" in r["workload"] else ""
        )
        out.append(f"| `{name}` | {r['operations']} | {r['seconds']:.1f} | {split} |")
    out += ["", f"Run: {meta['when']} on {meta['machine']}, `--jobs {meta['jobs']}`; "
            f"reproduce with `{meta['command']}`.", ""]  # fmt: skip
    return "\n".join(out)


def plot(records: list[dict[str, Any]], path: Path) -> None:
    """Violations per cell and crash model, plain next to atomic_ckpt."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(MODELS), figsize=(12, 4.5), sharey=True)
    labels = []
    for r in records:
        short = r["row"] + ("\n" + r["column"] if r["column"] == "plain" else "\natomic_ckpt")
        labels.append(short + (f" {r['variant']}" if r["variant"] else ""))
    for ax, model in zip(axes, MODELS, strict=True):
        vals = [r["violations"][model] for r in records]
        states = [r["states"][model] for r in records]
        colors = ["#c44e52" if r["column"] == "plain" else "#55a868" for r in records]
        bars = ax.bar(range(len(records)), vals, color=colors)
        for bar, v, s in zip(bars, vals, states, strict=True):
            ax.annotate(
                f"{v}/{s}",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
        ax.set_xticks(range(len(records)))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"{model}: violations / distinct states")
    axes[0].set_ylabel("crash states that fail the resume check")
    fig.suptitle("atomic-ckpt audit: plain save paths (red) vs atomic_ckpt (green), 3 saves each")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table_text(records: list[dict[str, Any]]) -> str:
    """The table as printed: one line per cell."""
    lines = [f"{'cell':34} {'ops':>5} {'kill':>9} {'power':>9} {'time s':>7}"]
    for r in records:
        name = r["row"] + "/" + r["column"] + (f"/{r['variant']}" if r["variant"] else "")
        kill = f"{r['violations']['kill']}/{r['states']['kill']}"
        power = f"{r['violations']['power']}/{r['states']['power']}"
        lines.append(f"{name:34} {r['operations']:>5} {kill:>9} {power:>9} {r['seconds']:>7.1f}")
    return "\n".join(lines)


def write(records: list[dict[str, Any]], meta: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "crash_table.json").write_text(
        json.dumps({"meta": meta, "cells": records}, indent=2) + "\n"
    )
    (out / "crash_table.md").write_text(markdown(records, meta))
    plot(records, out / "crash_table.png")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"some of {','.join(ROWS)}")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--max-states", type=int, default=None)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument(
        "--render", action="store_true", help="rewrite the table and chart from the JSON only"
    )
    args = parser.parse_args(argv)
    if args.render:
        data = json.loads((args.out / "crash_table.json").read_text())
        records, meta = data["cells"], data["meta"]
        (args.out / "crash_table.md").write_text(markdown(records, meta))
        plot(records, args.out / "crash_table.png")
    else:
        rows = [r for r in args.rows.split(",") if r]
        unknown = [r for r in rows if r not in ROWS]
        if unknown:
            parser.error(f"unknown rows {unknown}; choose from {list(ROWS)}")
        records = []
        with tempfile.TemporaryDirectory(prefix="crash-table-") as tmp:
            for key in rows:
                for cell in ROWS[key][2]:
                    print(f"auditing {cell.name} ...", file=sys.stderr, flush=True)
                    rec = audit_cell(cell, Path(tmp), jobs=args.jobs, max_states=args.max_states)
                    records.append(rec)
                    print(table_text([rec]).splitlines()[1], file=sys.stderr, flush=True)
        meta = {
            "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Linux "
            f"{platform.release()}, Python {platform.python_version()}",
            "jobs": args.jobs,
            "max_states": args.max_states,
            "command": "python benchmarks/crash_table.py"
            + ("" if args.rows == ",".join(ROWS) else f" --rows {args.rows}")
            + f" --jobs {args.jobs}",
        }
        write(records, meta, args.out)
    print(table_text(records))
    print()
    print(markdown(records, meta))
    bad = [r for r in records if r["column"] == "atomic_ckpt" and any(r["violations"].values())]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
