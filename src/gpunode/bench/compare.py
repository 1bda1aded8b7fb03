"""A result file against an earlier one, and A/B variants side by side.

Comparison: each level of this run is matched with the earlier file's level of the same concurrency
(and the same A/B value, when both are A/B runs; an A/B run against a plain sweep matches on
concurrency). A level is a regression when it is more than ``THRESHOLD`` (10 %) worse in any of:
output tok/s lower, TTFT p99 higher, TPOT p99 higher. Levels run with other input/output lengths
are not comparable and are reported as such, never as regressions.

A/B: per concurrency, each value's output tok/s, TTFT p99 and TPOT p99, and the change of each value
against the first one, the way the seeds put flashinfer_cutlass against flashinfer_cutedsl
(FIELD-NOTES s5).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

THRESHOLD = 0.10
# (metric, higher is better, label)
COMPARED = (("output_throughput", True, "output tok/s"), ("p99_ttft_ms", False, "TTFT p99"),
            ("p99_tpot_ms", False, "TPOT p99"))


class ResultFileError(ValueError):
    """An earlier result file that cannot be read as ours."""


def load_results(path: str | Path) -> list[dict[str, Any]]:
    """The level lines of a results.jsonl written by ``gpunode bench``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ResultFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    lines: list[dict[str, Any]] = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:
            raise ResultFileError(f"{path}:{number}: not JSON") from None
        if not isinstance(value, dict) or not isinstance(value.get("gpunode"), dict) \
                or not isinstance(value["gpunode"].get("concurrency"), int):
            raise ResultFileError(f"{path}:{number}: not a 'gpunode bench' level line (no gpunode.concurrency)")
        lines.append(value)
    if not lines:
        raise ResultFileError(f"{path}: no level in it")
    return lines


def number(line: dict[str, Any], metric: str) -> float | None:
    value = line.get(metric)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def change(new: float | None, old: float | None) -> float | None:
    """Relative change new vs old (0.12 = 12 % more)."""
    if new is None or old is None or old == 0:
        return None
    return new / old - 1.0


@dataclass
class MetricDelta:
    metric: str
    label: str
    old: float | None
    new: float | None
    change: float | None
    regressed: bool


@dataclass
class LevelComparison:
    concurrency: int
    variant: str | None
    comparable: bool
    note: str = ""
    deltas: list[MetricDelta] = field(default_factory=list)

    @property
    def regressed(self) -> bool:
        return any(d.regressed for d in self.deltas)

    def worst(self) -> str:
        bad = [d for d in self.deltas if d.regressed]
        return ", ".join(f"{d.label} {d.change * 100:+.1f} %" for d in bad if d.change is not None)


@dataclass
class Comparison:
    baseline: str
    threshold: float
    levels: list[LevelComparison]
    unmatched: list[int]  # concurrencies of this run the baseline lacks

    @property
    def regressions(self) -> list[LevelComparison]:
        return [level for level in self.levels if level.regressed]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "regressions": [(lc.variant, lc.concurrency) for lc in self.regressions]}


def _key(line: dict[str, Any]) -> tuple[str | None, int]:
    ours = line["gpunode"]
    return ours.get("variant"), int(ours["concurrency"])


def compare(current: list[dict[str, Any]], baseline: list[dict[str, Any]], baseline_name: str = "",
            threshold: float = THRESHOLD) -> Comparison:
    by_key = {_key(line): line for line in baseline if line.get("output_throughput") is not None}
    plain = {c: line for (variant, c), line in by_key.items() if variant is None}
    levels: list[LevelComparison] = []
    unmatched: list[int] = []
    for line in current:
        variant, concurrency = _key(line)
        old = by_key.get((variant, concurrency)) or plain.get(concurrency)
        if old is None:
            unmatched.append(concurrency)
            continue
        ours, theirs = line["gpunode"], old["gpunode"]
        shape_new = (ours.get("input_len"), ours.get("output_len"))
        shape_old = (theirs.get("input_len"), theirs.get("output_len"))
        if shape_new != shape_old:
            levels.append(LevelComparison(concurrency, variant, False,
                                          f"not comparable: input/output {shape_new[0]}/{shape_new[1]} here, "
                                          f"{shape_old[0]}/{shape_old[1]} in the baseline"))
            continue
        if line.get("output_throughput") is None:
            levels.append(LevelComparison(concurrency, variant, False, "no result in this run"))
            continue
        deltas = []
        for metric, higher_better, label in COMPARED:
            new, was = number(line, metric), number(old, metric)
            delta = change(new, was)
            worse = delta is not None and (delta < -threshold if higher_better else delta > threshold)
            deltas.append(MetricDelta(metric, label, was, new, None if delta is None else round(delta, 4), worse))
        levels.append(LevelComparison(concurrency, variant, True, deltas=deltas))
    return Comparison(baseline_name, threshold, levels, unmatched)


@dataclass
class AbRow:
    concurrency: int
    values: dict[str, dict[str, float | None]]  # value -> metric -> number
    changes: dict[str, dict[str, float | None]]  # value (not the first) -> metric -> change vs the first


@dataclass
class AbTable:
    flag: str
    values: list[str]
    rows: list[AbRow]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def ab_table(lines: list[dict[str, Any]], flag: str, values: list[str]) -> AbTable:
    by_key = {_key(line): line for line in lines}
    levels = sorted({c for (_v, c) in by_key})
    rows = []
    for concurrency in levels:
        numbers = {value: {metric: number(by_key.get((value, concurrency), {}), metric)
                           for metric, _h, _l in COMPARED} for value in values}
        first = numbers[values[0]]
        changes = {value: {metric: change(numbers[value][metric], first[metric]) for metric, _h, _l in COMPARED}
                   for value in values[1:]}
        rows.append(AbRow(concurrency, numbers, changes))
    return AbTable(flag, list(values), rows)
