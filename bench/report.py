"""Output of a run: the plain-text tables, the JSON document and the PNG plot."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.figure_records import Curve, Figure
from bench.harness import Stats
from bench.runner import Run

JSON_VERSION = 1
DASH = "—"


def fmt(value: float | str | None, unit: str = "") -> str:
    """A number at a sensible precision (thousands separated), or the text as is."""
    if value is None:
        return DASH
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if unit == "actors" or (isinstance(value, int) and not isinstance(value, bool)):
        return f"{value:,.0f}"
    mag = abs(value)
    if mag >= 1000:
        return f"{value:,.0f}"
    if mag >= 100:
        return f"{value:.0f}"
    if mag >= 10:
        return f"{value:.1f}"
    if mag >= 1:
        return f"{value:.2f}"
    if mag == 0:
        return "0"
    return f"{value:.3g}"


def fmt_ratio(ratio: float | None) -> str:
    return DASH if ratio is None else f"{ratio:.2f}x"


def fmt_met(met: bool | None) -> str:
    return {True: "MET", False: "MISSED", None: "n/a"}[met]


def table(headers: Sequence[str], rows: Sequence[Sequence[str] | str], right: set[int]) -> str:
    """Aligned plain-text table. A row given as a str is a free section line."""
    widths = [len(h) for h in headers]
    for row in rows:
        if isinstance(row, str):
            continue
        for i, cell in enumerate(row[: len(headers) - 1]):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            if i == len(headers) - 1:
                out.append(cell)
            elif i in right:
                out.append(cell.rjust(widths[i]))
            else:
                out.append(cell.ljust(widths[i]))
        return "  ".join(out).rstrip()

    lines = [line(headers), line(["-" * w for w in widths[:-1]] + ["-" * widths[-1]])]
    for row in rows:
        lines.append(row if isinstance(row, str) else line(row))
    return "\n".join(lines)


def _stat_cells(value: float | str, stats: Stats | None, unit: str) -> list[str]:
    if isinstance(value, str):
        return [DASH, DASH, DASH]
    if stats is None:
        return [fmt(value, unit), DASH, "1"]
    return [fmt(value, unit), fmt(stats.p99 if stats.n > 1 else None, unit), str(stats.n)]


def render_machine(run: Run) -> str:
    m = run.machine
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    mode = "quick" if run.quick else "full"
    return "\n".join(
        [
            f"corral bench ({mode} run, {run.elapsed_s:.0f} s)",
            f"machine: {m['cores']} cores ({m['usable_cores']} usable), "
            f"{m['memory_gib']} GiB, {m['cpu_model']}, Linux {m['kernel']}, {m['python']}",
            f"other load: {m['cpu_busy_pct_at_start']}% CPU busy at start, other processes "
            f"used {m.get('other_cpu_s_during_run')} CPU-s ({m.get('other_cpu_pct_during_run')}%"
            f" of the machine) during the run; load average start {m['loadavg_at_start']}, "
            f"end {m.get('loadavg_at_end')}"
            + (f"; waited {m['waited_for_quiet_s']} s for a quiet machine first"
               if m.get("waited_for_quiet_s") else ""),
            f"/tmp on {m['tmp_filesystem']}",
            f"processes left at the end: {len(run.final_leftovers)}"
            + (f" (killed: {'; '.join(run.final_leftovers)})" if run.final_leftovers else ""),
            f"versions: {versions}",
        ]
    )


def render_workloads(run: Run) -> str:
    rows: list[Sequence[str] | str] = []
    for res in run.results.values():
        if res.status == "not selected":
            continue
        note = res.reason or ""
        extra = "; ".join(res.notes)
        rows.append(
            [res.name, res.group, res.status, f"{res.elapsed_s:.1f}",
             "; ".join(x for x in (note, extra) if x)]
        )
    return table(["workload", "group", "status", "s", "notes"], rows, right={3})


def render_measurements(run: Run) -> str:
    rows: list[Sequence[str] | str] = []
    for res in run.results.values():
        for key, value in res.metrics.items():
            if isinstance(value, Stats):
                rows.append(
                    [f"{res.name}.{key}", value.unit, fmt(value.median), fmt(value.p99),
                     fmt(value.min), str(value.n)]
                )
            else:
                rows.append([f"{res.name}.{key}", "", fmt(value), DASH, DASH, "1"])
        for key, reason in res.skipped.items():
            rows.append([f"{res.name}.{key}", "", DASH, DASH, DASH, f"not run: {reason}"])
    return table(["metric", "unit", "median", "p99", "min", "n"], rows, right={2, 3, 4, 5})


def render_figures(figures: Sequence[Figure]) -> str:
    rows: list[Sequence[str] | str] = []
    for fig in figures:
        target = f"   target: {fig.target} -> {fmt_met(fig.met)}" if fig.target else ""
        rows.append("")
        rows.append(f"{fig.name}: {fig.metric} ({fig.unit}){target}")
        corral_note = fig.corral if isinstance(fig.corral, str) else ""
        ratio = fmt_ratio(fig.ratio) if fig.ratio is not None else DASH
        rows.append(["  corral", *_stat_cells(fig.corral, fig.corral_stats, fig.unit),
                     ratio, corral_note])
        for label, value in fig.baselines.items():
            mark = " *" if label == fig.reference else ""
            note = value if isinstance(value, str) else ""
            rows.append(
                [f"  {label}{mark}",
                 *_stat_cells(value, fig.baseline_stats.get(label), fig.unit),
                 fmt_ratio(fig.ratios.get(label)), note]
            )
        if fig.note:
            rows.append(f"  ({fig.note})")
    header = ["figure / system", "p50|value", "p99", "n", "corral/row", "note"]
    return table(header, rows, right={1, 2, 3, 4})


def render_summary(figures: Sequence[Figure]) -> str:
    rows: list[Sequence[str] | str] = []
    for fig in figures:
        ref_value = fig.baselines.get(fig.reference or "", None)
        ref = f"{fig.reference}: {fmt(ref_value, fig.unit)}" if fig.reference else DASH
        corral = DASH if isinstance(fig.corral, str) else fmt(fig.corral, fig.unit)
        rows.append(
            [fig.name, fig.unit, corral, fmt_ratio(fig.ratio), fmt_met(fig.met),
             fig.target or DASH, ref]
        )
    return table(
        ["figure", "unit", "corral", "ratio", "target", "wanted", "reference baseline"],
        rows,
        right={2, 3},
    )


def render_curves(curves: Sequence[Curve]) -> str:
    parts = []
    for crv in curves:
        rows: list[Sequence[str] | str] = []
        notes: list[str] = []
        for label, points in crv.series.items():
            cells = []
            for n in crv.xs:
                value = points.get(n)
                if isinstance(value, str):
                    cells.append(DASH)
                    reason = value.removeprefix("not run: ")
                    if f"{label}: {reason}" not in notes:
                        notes.append(f"{label}: {reason}")
                else:
                    cells.append(fmt(value, crv.unit))
            rows.append([label, *cells, ""])
        headers = ["", *[f"N={n:,}" for n in crv.xs], ""]
        body = table(headers, rows, right=set(range(1, len(crv.xs) + 1)))
        note_text = "".join(f"\n  not run: {n}" for n in notes)
        parts.append(f"{crv.name}: {crv.title} ({crv.unit})\n{body}{note_text}")
    return "\n\n".join(parts)


def render(run: Run) -> str:
    sections = [
        render_machine(run),
        "== workloads ==\n" + render_workloads(run),
        "== measurements ==\n" + render_measurements(run),
    ]
    if run.curves:
        sections.append("== scaling curves ==\n" + render_curves(run.curves))
    if run.figures:
        sections.append(
            "== figures: corral vs baselines, same run (corral/row = corral's value / that row's; "
            "* = reference) ==\n" + render_figures(run.figures)
        )
        sections.append("== summary ==\n" + render_summary(run.figures))
    return "\n\n".join(sections) + "\n"


def to_json(run: Run, argv: Sequence[str], plot: str | None) -> dict[str, Any]:
    return {
        "version": JSON_VERSION,
        "argv": list(argv),
        "quick": run.quick,
        "started_at": run.started_at,
        "elapsed_s": round(run.elapsed_s, 1),
        "subreaper": run.subreaper,
        "final_leftovers": run.final_leftovers,
        "machine": run.machine,
        "workloads": [r.to_json() for r in run.results.values()],
        "figures": [f.to_json() for f in run.figures],
        "curves": [c.to_json() for c in run.curves],
        "plot": plot,
    }


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(path)


def write_plot(path: Path, curves: Sequence[Curve], title: str) -> str:
    """Write the scaling curves as one PNG; returns the path, or a note why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "not written: matplotlib is not installed (pip install matplotlib)"
    drawable = [
        c for c in curves
        if any(isinstance(v, int | float) for pts in c.series.values() for v in pts.values())
    ]
    if not drawable:
        return "not written: no curve has a measured point"
    labels = list(dict.fromkeys(lb for c in drawable for lb in c.series))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colors = {"corral": "black"}
    for lb in labels:
        colors.setdefault(lb, palette[(len(colors) - 1) % len(palette)])
    fig, axes = plt.subplots(1, len(drawable), figsize=(5.2 * len(drawable), 4.2), squeeze=False)
    for ax, crv in zip(axes[0], drawable, strict=True):
        for label, points in crv.series.items():
            xs = [n for n in crv.xs if isinstance(points.get(n), int | float)]
            ys = [float(points[n]) for n in xs]
            if not xs:
                continue
            style = "-o" if label == "corral" else "--."
            ax.plot(xs, ys, style, label=label, color=colors[label],
                    linewidth=2.2 if label == "corral" else 1.2)
        missing = [lb for lb, pts in crv.series.items()
                   if not any(isinstance(v, int | float) for v in pts.values())]
        if missing:
            ax.text(0.01, 0.01, "not run: " + ", ".join(missing), transform=ax.transAxes,
                    fontsize=7, color="0.35", va="bottom")
        ax.set_xscale("log")
        if crv.log_y:
            ys_all = [float(v) for p in crv.series.values() for v in p.values()
                      if isinstance(v, int | float) and v > 0]
            if ys_all and max(ys_all) / max(min(ys_all), 1e-12) > 20 and not any(
                isinstance(v, int | float) and v <= 0
                for p in crv.series.values() for v in p.values()
            ):
                ax.set_yscale("log")
        ax.set_xticks(list(crv.xs), [f"{n:,}" for n in crv.xs])
        ax.set_xlabel("actors (N)")
        ax.set_ylabel(crv.unit)
        ax.set_title(crv.title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


def finite(doc: Any) -> Any:
    """Replace NaN/inf (not valid JSON) by None, recursively."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return None
    if isinstance(doc, dict):
        return {k: finite(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [finite(v) for v in doc]
    return doc


def emit(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()
