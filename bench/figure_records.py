"""The figure and curve records: what a figure compares (corral's metric against
its baselines, each a reference to a workload's metric), its target, and how a
figure or a curve is built from one run's results. The figures themselves are
declared in bench/figures.py; the workloads that measure are in bench/harness.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bench.harness import Stats, WorkloadResult, convert


@dataclass(frozen=True)
class Ref:
    """``workload.metric[:stat]``: one number among the run's metrics."""

    workload: str
    metric: str
    stat: str = "median"

    @classmethod
    def parse(cls, text: str) -> Ref:
        head, _, stat = text.partition(":")
        wl, dot, metric = head.partition(".")
        if not dot or not wl or not metric:
            raise ValueError(f"bad reference {text!r} (want workload.metric[:stat])")
        return cls(wl, metric, stat or "median")

    def __str__(self) -> str:
        return f"{self.workload}.{self.metric}:{self.stat}"


@dataclass(frozen=True)
class Lookup:
    """The outcome of resolving a Ref: a value (in the asked unit) or a reason."""

    value: float | None
    stats: Stats | None
    reason: str | None
    missing: bool = False
    """The workload ran but never reported this metric (a curve leaves the point out)."""

    @property
    def display(self) -> float | str:
        return self.value if self.value is not None else f"not run: {self.reason}"


def resolve(results: Mapping[str, WorkloadResult], ref: Ref, unit: str) -> Lookup:
    res = results.get(ref.workload)
    if res is None:
        return Lookup(None, None, f"no workload named {ref.workload!r}")
    if res.status == "not selected":
        return Lookup(None, None, "not selected (--only)")
    if res.status != "ok" and ref.metric not in res.metrics:
        return Lookup(None, None, res.reason or res.status)
    if ref.metric in res.skipped:
        return Lookup(None, None, res.skipped[ref.metric])
    if ref.metric not in res.metrics:
        return Lookup(None, None, f"{ref.workload} did not report {ref.metric!r}", True)
    raw = res.metrics[ref.metric]
    if isinstance(raw, Stats):
        stats: Stats | None = raw
        value = convert(raw.get(ref.stat), raw.unit, unit)
        if raw.unit != unit:
            stats = raw.scaled(convert(1.0, raw.unit, unit), unit)
    else:
        stats = None
        value = float(raw)
    return Lookup(value, stats, None)


# --------------------------------------------------------------------------------------
# figures and curves


@dataclass(frozen=True)
class Target:
    """One condition on a figure, e.g. ``Target("ratio<=", 1.5)``.

    kinds: ``ratio<=``/``ratio>=`` (corral / reference baseline), ``value<=``/``value>=``
    (corral's own value, in the figure's unit), ``below`` (corral's value below the
    baseline named ``label``).
    """

    kind: Literal["ratio<=", "ratio>=", "value<=", "value>=", "below"]
    threshold: float = 0.0
    label: str = ""
    text: str = ""

    def evaluate(
        self, corral: float | None, ratio: float | None, baselines: Mapping[str, Lookup]
    ) -> bool | None:
        if corral is None:
            return None
        if self.kind == "ratio<=":
            return None if ratio is None else ratio <= self.threshold
        if self.kind == "ratio>=":
            return None if ratio is None else ratio >= self.threshold
        if self.kind == "value<=":
            return corral <= self.threshold
        if self.kind == "value>=":
            return corral >= self.threshold
        other = baselines.get(self.label)
        if other is None or other.value is None:
            return None
        return corral < other.value


@dataclass(frozen=True)
class FigureSpec:
    """Declares one figure: where corral's value and each baseline's value come from.

    ``baselines`` maps a label to a Ref text, or to a literal ``"not run: reason"``
    for a peer that has no equivalent. ``reference`` lists labels in preference
    order: the first one with a value is the ratio's denominator.
    """

    name: str
    metric: str
    unit: str
    corral: str
    baselines: Mapping[str, str]
    reference: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()
    target_text: str = ""
    higher_is_better: bool = False
    note: str = ""

    def refs(self) -> list[Ref]:
        out = [Ref.parse(self.corral)]
        out += [Ref.parse(r) for r in self.baselines.values() if not r.startswith("not run")]
        return out


@dataclass
class Figure:
    """One row of results: corral's value next to its baselines, with the ratio."""

    name: str
    metric: str
    unit: str
    corral: float | str
    corral_stats: Stats | None
    baselines: dict[str, float | str]
    baseline_stats: dict[str, Stats]
    reference: str | None
    ratio: float | None
    ratios: dict[str, float]
    target: str
    met: bool | None
    higher_is_better: bool
    note: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "metric": self.metric,
            "unit": self.unit,
            "corral": self.corral,
            "corral_stats": self.corral_stats.to_json() if self.corral_stats else None,
            "baselines": self.baselines,
            "baseline_stats": {k: v.to_json() for k, v in self.baseline_stats.items()},
            "reference": self.reference,
            "ratio": self.ratio,
            "ratios": self.ratios,
            "target": self.target,
            "met": self.met,
            "higher_is_better": self.higher_is_better,
            "note": self.note,
        }


FIGURES: dict[str, FigureSpec] = {}


def figure(spec: FigureSpec) -> FigureSpec:
    """Register a figure spec (names are unique)."""
    if spec.name in FIGURES:
        raise ValueError(f"figure {spec.name!r} declared twice")
    for ref in spec.refs():  # fail fast on typos
        _ = ref
    if spec.reference and not set(spec.reference) <= set(spec.baselines):
        raise ValueError(f"figure {spec.name!r}: reference not among its baselines")
    FIGURES[spec.name] = spec
    return spec


def build_figure(spec: FigureSpec, results: Mapping[str, WorkloadResult]) -> Figure:
    corral = resolve(results, Ref.parse(spec.corral), spec.unit)
    lookups: dict[str, Lookup] = {}
    for label, text in spec.baselines.items():
        if text.startswith("not run"):
            lookups[label] = Lookup(None, None, text.partition(":")[2].strip() or text)
        else:
            lookups[label] = resolve(results, Ref.parse(text), spec.unit)
    reference = next((lb for lb in spec.reference if lookups[lb].value is not None), None)
    if reference is None and spec.reference:
        reference = spec.reference[0]
    ratios: dict[str, float] = {}
    if corral.value is not None:
        for label, look in lookups.items():
            if look.value:
                ratios[label] = corral.value / look.value
    ratio = ratios.get(reference) if reference else None
    verdicts = [t.evaluate(corral.value, ratio, lookups) for t in spec.targets]
    if not verdicts:
        met: bool | None = None
    elif any(v is False for v in verdicts):
        met = False
    elif all(v is True for v in verdicts):
        met = True
    else:
        met = None
    return Figure(
        name=spec.name,
        metric=spec.metric,
        unit=spec.unit,
        corral=corral.display,
        corral_stats=corral.stats,
        baselines={lb: look.display for lb, look in lookups.items()},
        baseline_stats={lb: look.stats for lb, look in lookups.items() if look.stats},
        reference=reference,
        ratio=ratio,
        ratios=ratios,
        target=spec.target_text,
        met=met,
        higher_is_better=spec.higher_is_better,
        note=spec.note,
    )


@dataclass(frozen=True)
class CurveSpec:
    """How a quantity grows with the number of actors: one series per system.

    Each series is a Ref template with ``{n}``, e.g. ``"mp_start.forkserver_{n}"``.
    """

    name: str
    title: str
    unit: str
    xs: tuple[int, ...]
    series: Mapping[str, str]
    log_y: bool = True

    def refs(self) -> list[Ref]:
        return [Ref.parse(t.format(n=n)) for t in self.series.values() for n in self.xs]


@dataclass
class Curve:
    name: str
    title: str
    unit: str
    xs: list[int]
    series: dict[str, dict[int, float | str]]
    log_y: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "title": self.title,
            "unit": self.unit,
            "xs": self.xs,
            "series": {k: {str(n): v for n, v in pts.items()} for k, pts in self.series.items()},
        }


CURVES: dict[str, CurveSpec] = {}


def curve(spec: CurveSpec) -> CurveSpec:
    if spec.name in CURVES:
        raise ValueError(f"curve {spec.name!r} declared twice")
    CURVES[spec.name] = spec
    return spec


def build_curve(spec: CurveSpec, results: Mapping[str, WorkloadResult]) -> Curve:
    series: dict[str, dict[int, float | str]] = {}
    for label, template in spec.series.items():
        points: dict[int, float | str] = {}
        for n in spec.xs:
            look = resolve(results, Ref.parse(template.format(n=n)), spec.unit)
            if not look.missing:
                points[n] = look.display
        series[label] = points
    return Curve(spec.name, spec.title, spec.unit, list(spec.xs), series, spec.log_y)
