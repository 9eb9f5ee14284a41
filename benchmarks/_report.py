"""The fsync_overhead report: rows computed from the timed runs, a markdown table, a chart.

``rows_of`` turns the runs into the rows written to ``fsync_overhead.json``;
``markdown`` and ``plot`` render those rows and the run's meta data
(``fsync_overhead_meta.json``), so a report can be re-rendered from the two
JSON files alone (``--render``).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _harness import Method, MiB, Result


def rows_of(results: Sequence[Result], meths: Sequence[Method[Any]]) -> list[dict[str, Any]]:
    """One row per case and method: medians, spreads, ratios to ``floor`` and ``unsafe``."""
    notes = {m.name: m.note for m in meths}
    rows: list[dict[str, Any]] = []
    by_case: dict[str, dict[str, Result]] = {}
    for r in results:
        by_case.setdefault(r.case, {})[r.method] = r
    for case, res in by_case.items():
        floor = statistics.median(res["floor"].runs)
        floor_min = min(res["floor"].runs)
        unsafe = statistics.median(res["unsafe"].runs)
        for name, r in res.items():
            med = statistics.median(r.runs)
            lo, hi = min(r.runs), max(r.runs)
            rows.append(
                {
                    "case": case,
                    "method": name,
                    "note": notes[name],
                    "median_s": med,
                    "min_s": lo,
                    "max_s": hi,
                    "spread": (hi - lo) / med if med else 0.0,
                    "runs": r.runs,
                    "ratio_to_floor": med / floor if floor else None,
                    "ratio_to_floor_min": lo / floor_min if floor_min else None,
                    # Runs of one repetition ran back to back (the order rotating):
                    # the median of the per-repetition ratios cancels slow drift
                    # in the machine's background load.
                    "ratio_to_floor_paired": statistics.median(
                        a / b for a, b in zip(r.runs, res["floor"].runs, strict=True)
                    ),
                    "ratio_to_unsafe": med / unsafe if unsafe else None,
                    "fsyncs": r.fsyncs.get("files", 0) + r.fsyncs.get("dirs", 0),
                    "fsyncs_files": r.fsyncs.get("files", 0),
                    "fsyncs_dirs": r.fsyncs.get("dirs", 0),
                }
            )
    return rows


def _fmt_s(s: float) -> str:
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The report: machine and settings, the summary, one table per case, peak memory."""
    lines = [
        "# What durability costs (`benchmarks/fsync_overhead.py`)",
        "",
        f"Machine: {meta['machine_line']}.",
        "",
        f"Load average at the end of the run: {', '.join(meta.get('loadavg_end', []))} "
        "(other work shared the machine: compare methods within a case, not across runs)."
        + (
            f" {meta['busy_processes']} CPU-bound processes ran throughout (`--busy`), "
            "as a trainer's data-loader workers would."
            if meta.get("busy_processes")
            else ""
        ),
        "",
        f"Run: {meta['finished']}, `{meta['command']}`"
        + (f", code {meta['code']}" if meta.get("code") else "")
        + f"; {meta['settle']}. Each cell is the "
        "median of the repetitions (spread = (max - min) / median); ratio = median / median of "
        "`floor`; fsyncs counted in one run (files + directories).",
        "",
    ]
    lines += summary(rows, meta)
    cases = list(dict.fromkeys(r["case"] for r in rows))
    for case in cases:
        case_rows = [r for r in rows if r["case"] == case]
        lines += [
            f"## {case}",
            "",
            "| method | median | min | spread | runs | / floor | (paired) | (best) | / unsafe "
            "| fsyncs (files+dirs) | note |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in case_rows:
            lines.append(
                f"| {r['method']} | {_fmt_s(r['median_s'])} | {_fmt_s(r['min_s'])} "
                f"| {r['spread'] * 100:.0f}% | {len(r['runs'])} | {r['ratio_to_floor']:.3f} "
                f"| {r['ratio_to_floor_paired']:.3f} | {r['ratio_to_floor_min']:.3f} "
                f"| {r['ratio_to_unsafe']:.3f} "
                f"| {r['fsyncs']} ({r['fsyncs_files']}+{r['fsyncs_dirs']}) | {r['note']} |"
            )
        lines.append("")
    for mem in meta.get("memory", []):
        rss = mem["rss_peak_delta_bytes"]
        rss_s = f"{rss / MiB:.1f} MiB" if rss is not None else "n/a"
        lines += [
            f"Peak memory of one durable commit of {mem['case']} ({mem['method']}): "
            f"tracemalloc peak {mem['tracemalloc_peak_bytes'] / MiB:.2f} MiB, "
            f"peak RSS growth {rss_s}, for {mem['bytes_committed'] / MiB:.0f} MiB committed.",
            "",
        ]
    return "\n".join(lines)


def _row(rows: list[dict[str, Any]], case: str, method: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["case"] == case and r["method"] == method), None)


def summary(rows: list[dict[str, Any]], meta: dict[str, Any]) -> list[str]:
    """The targets of the issue, one line per case, computed from the rows."""
    lat = meta.get("fsync_latency") or {}
    default = meta.get("default_checksum")
    lines = [
        "## Summary",
        "",
        f"fsync latency here (median): 4 KiB file {lat.get('file_4k_s', 0) * 1e3:.2f} ms, "
        f"directory {lat.get('dir_s', 0) * 1e3:.2f} ms. Default checksum: `{default}`. "
        "Ratios of medians; (paired) = median over repetitions of atomic_ckpt / floor "
        "within the same repetition; (best runs) = fastest atomic_ckpt run / fastest floor "
        "run. The last two are steadier when other work shares the machine. checksum cost = "
        "(default - checksum=None) / default; fixed cost = atomic_ckpt - floor (medians).",
        "",
        "| case | atomic_ckpt / floor | (paired) | (best runs) | / unsafe | / dcp sync_files "
        "| checksum cost | fixed cost | extra fsyncs | serial / parallel |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in dict.fromkeys(r["case"] for r in rows):
        a, floor = _row(rows, case, "atomic_ckpt"), _row(rows, case, "floor")
        if a is None or floor is None:
            continue
        none = _row(rows, case, "atomic_ckpt checksum=None")
        dcp = _row(rows, case, "dcp sync_files")
        serial = _row(rows, case, "atomic_ckpt serial")
        ck = f"{(a['median_s'] - none['median_s']) / a['median_s'] * 100:+.1f}%" if none else "-"
        vs_dcp = f"{a['median_s'] / dcp['median_s']:.2f}" if dcp else "-"
        ser = f"{serial['median_s'] / a['median_s']:.2f}" if serial else "-"
        lines.append(
            f"| {case} | {a['ratio_to_floor']:.3f} | {a['ratio_to_floor_paired']:.3f} "
            f"| {a['ratio_to_floor_min']:.3f} "
            f"| {a['ratio_to_unsafe']:.2f} | {vs_dcp} | {ck} "
            f"| {(a['median_s'] - floor['median_s']) * 1e3:+.1f} ms "
            f"| {a['fsyncs'] - floor['fsyncs']} | {ser} |"
        )
    lines.append("")
    return lines


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Each method's median time relative to ``floor``, one panel per case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(dict.fromkeys(r["case"] for r in rows))
    n = len(cases)
    nmeth = max(sum(1 for r in rows if r["case"] == c) for c in cases)
    fig, axes = plt.subplots(n, 1, figsize=(9, 0.32 * nmeth * n + 1.2 * n), squeeze=False)
    for ax, case in zip(axes[:, 0], cases, strict=True):
        case_rows = [r for r in rows if r["case"] == case]
        floor = next(r["median_s"] for r in case_rows if r["method"] == "floor")
        names = [r["method"] for r in case_rows]
        ratios = [r["ratio_to_floor"] for r in case_rows]
        lo = [r["ratio_to_floor"] - r["min_s"] / floor for r in case_rows]
        hi = [r["max_s"] / floor - r["ratio_to_floor"] for r in case_rows]
        colors = [
            "tab:gray"
            if name == "unsafe"
            else "black"
            if name == "floor"
            else "tab:blue"
            if name.startswith("atomic_ckpt")
            else "tab:orange"
            for name in names
        ]
        y = range(len(names))
        ax.barh(list(y), ratios, xerr=[lo, hi], color=colors, capsize=2)
        ax.axvline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yticks(list(y), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(f"{case} (floor = {_fmt_s(floor)})", fontsize=10)
        ax.set_xlabel("median time / floor (whiskers: min..max)", fontsize=8)
        for yi, ratio in zip(y, ratios, strict=True):
            ax.text(ratio, yi, f" {ratio:.2f}", va="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def load(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows and the meta data a run wrote to ``out``."""
    rows = json.loads((out / "fsync_overhead.json").read_text())
    meta = json.loads((out / "fsync_overhead_meta.json").read_text())
    return rows, meta


def write(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any], *, chart: bool) -> str:
    """Write the rows and the meta data as JSON, then render them; returns the markdown."""
    (out / "fsync_overhead.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "fsync_overhead_meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    return render(out, rows, meta, chart=chart)


def render(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any], *, chart: bool) -> str:
    """Write ``fsync_overhead.md`` (and, with ``chart``, ``.png``) into ``out``; returns the md."""
    text = markdown(rows, meta)
    (out / "fsync_overhead.md").write_text(text)
    if chart:
        plot(rows, out / "fsync_overhead.png")
    return text
