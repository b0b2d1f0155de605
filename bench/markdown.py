"""Render a results JSON as Markdown tables for docs/performance.md.

    python -m bench.markdown bench/results/latest.json
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.report import fmt, fmt_met, fmt_ratio


def _cell(value: Any, stats: dict[str, Any] | None, unit: str) -> tuple[str, str, str]:
    if isinstance(value, str):
        return value, "", ""
    if stats is None:
        return fmt(value, unit), "", "1"
    p99 = fmt(stats["p99"], unit) if stats["n"] > 1 else ""
    return fmt(value, unit), p99, str(stats["n"])


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(doc["started_at"]))
    lines = [
        f"Run of {when} UTC ({'quick' if doc['quick'] else 'full'}, {doc['elapsed_s']:.0f} s): "
        f"{m['cores']} cores, {m['memory_gib']} GiB, {m['cpu_model']}, Linux {m['kernel']}, "
        f"{m['python']}; " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()) + ".",
        "",
        f"Other work on the machine during the run: {m.get('other_cpu_s_during_run')} CPU-s "
        f"({m.get('other_cpu_pct_during_run')}% of its capacity).",
        "",
        "| figure | system | p50 / value | p99 | n | corral/row | target |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    seen: dict[str, str] = {}
    for fig in doc["figures"]:
        unit = fig["unit"]
        value, p99, n = _cell(fig["corral"], fig["corral_stats"], unit)
        target = f"{fig['target']}: {fmt_met(fig['met'])}" if fig["target"] else ""
        lines.append(
            f"| **{fig['name']}** ({unit}) | corral | {value} | {p99} | {n} | "
            f"{fmt_ratio(fig['ratio'])} | {target} |"
        )
        key = json.dumps([fig["baselines"], fig["reference"]], sort_keys=True)
        if key in seen and fig["corral_stats"] is None:
            lines.append(f"| | *baselines as in {seen[key]}* | | | | | |")
            continue
        seen.setdefault(key, fig["name"])
        for label, base in fig["baselines"].items():
            value, p99, n = _cell(base, fig["baseline_stats"].get(label), unit)
            mark = " *" if label == fig["reference"] else ""
            ratio = fmt_ratio(fig["ratios"].get(label))
            lines.append(f"| | {label}{mark} | {value} | {p99} | {n} | {ratio} | |")
    for crv in doc["curves"]:
        xs = crv["xs"]
        lines += ["", f"**{crv['name']}**: {crv['title']} ({crv['unit']})", ""]
        lines.append("| system | " + " | ".join(f"N={n:,}" for n in xs) + " |")
        lines.append("|---|" + "---:|" * len(xs))
        for label, pts in crv["series"].items():
            cells = []
            for n in xs:
                v = pts.get(str(n))
                cells.append("—" if v is None or isinstance(v, str) else fmt(v, crv["unit"]))
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m bench.markdown RESULTS.json", file=sys.stderr)
        return 2
    sys.stdout.write(render(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
