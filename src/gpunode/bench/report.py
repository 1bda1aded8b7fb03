"""The report: Markdown (a table per level, the A/B side by side, the comparison, the roofline) and
two PNG plots, throughput and power against concurrency (matplotlib with the Agg backend, from the
``bench`` extra; without it the report says the plots were skipped)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpunode.bench import roofline as roofline_mod
from gpunode.bench.compare import COMPARED, AbTable, Comparison

THROUGHPUT_PNG = "throughput.png"
POWER_PNG = "power.png"


@dataclass
class ReportInput:
    title: str
    lines: list[dict[str, Any]]
    settings: dict[str, Any]  # input_len, output_len, url, served_name, started_at, sampling
    ab: AbTable | None = None
    comparison: Comparison | None = None
    roofline: roofline_mod.Roofline | None = None
    plots: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _num(value: Any, digits: int = 1) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "-"
    return f"{value:,.{digits}f}"


def _pct(share: Any) -> str:
    return "-" if not isinstance(share, (int, float)) else f"{share * 100:.0f} %"


def _change(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f} %"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def variants(lines: Sequence[dict[str, Any]]) -> list[str | None]:
    seen: list[str | None] = []
    for line in lines:
        variant = line["gpunode"].get("variant")
        if variant not in seen:
            seen.append(variant)
    return seen


def level_table(lines: Sequence[dict[str, Any]]) -> list[str]:
    out = ["| concurrency | prompts | failed | req/s | output tok/s | total tok/s | TTFT median / p99 (ms) | "
           "TPOT median / p99 (ms) | power mean / peak (% TDP) | GPU busy | finding |",
           "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for line in sorted(lines, key=lambda item: item["gpunode"]["concurrency"]):
        ours = line["gpunode"]
        gpu = ours.get("gpu") or {}
        failed = ours.get("failed_requests")
        busy = gpu.get("mean_util_pct")
        busy_text = "-" if busy is None else f"{busy:.0f} %"
        finding = (gpu.get("finding") or "") if gpu.get("available") else ""  # else said once, above
        if ours.get("error"):
            finding = f"**{ours['error']}**" + (f"; {finding}" if finding else "")
        out.append(
            f"| {ours['concurrency']} | {ours.get('num_prompts', '-')} | {'-' if failed is None else failed} | "
            f"{_num(line.get('request_throughput'), 2)} | {_num(line.get('output_throughput'))} | "
            f"{_num(line.get('total_throughput'))} | {_num(line.get('median_ttft_ms'), 0)} / "
            f"{_num(line.get('p99_ttft_ms'), 0)} | {_num(line.get('median_tpot_ms'))} / "
            f"{_num(line.get('p99_tpot_ms'))} | {_pct(gpu.get('mean_power_share'))} / "
            f"{_pct(gpu.get('peak_power_share'))} | "
            f"{busy_text} | {_cell(finding)} |")
    return out


def workers_section(lines: Sequence[dict[str, Any]]) -> list[str]:
    """Through a router: the requests each worker got per level (the router's own metrics) beside
    the level's totals."""
    workers = sorted({url for line in lines for url in (line["gpunode"].get("workers") or {})})
    out = ["## Requests per worker (the router's metrics)", "",
           "Each level's requests as the router sent them on (`smg_worker_cb_outcomes_total`, successes and "
           "failures; a retried request counts at each worker it tried).", "",
           "| concurrency | completed | output tok/s | " + " | ".join(workers) + " |",
           "| ---: | ---: | ---: | " + " | ".join("---:" for _ in workers) + " |"]
    for line in sorted(lines, key=lambda item: item["gpunode"]["concurrency"]):
        counts = line["gpunode"].get("workers") or {}
        out.append(f"| {line['gpunode']['concurrency']} | {line.get('completed', '-')} | "
                   f"{_num(line.get('output_throughput'))} | " + " | ".join(str(counts.get(url, 0)) for url in workers) + " |")
    return out


def ab_section(ab: AbTable) -> list[str]:
    first = ab.values[0]
    head = ["concurrency"]
    for metric, _higher, label in COMPARED:
        unit = "" if metric == "output_throughput" else " (ms)"
        head += [f"{value} {label}{unit}" for value in ab.values]
        head += [f"{label}: {value} vs {first}" for value in ab.values[1:]]
    out = [f"## A/B: `{ab.flag}` = {', '.join(f'`{v}`' for v in ab.values)}", "",
           "Each value's sweep after a server restart with only this flag changed; changes are against "
           f"`{first}` (output tok/s: higher is better; TTFT and TPOT p99: lower is better).", "",
           "| " + " | ".join(head) + " |", "| " + " | ".join(["---:"] * len(head)) + " |"]
    for row in ab.rows:
        cells = [str(row.concurrency)]
        for metric, _higher, _label in COMPARED:
            digits = 1 if metric == "output_throughput" else 0 if metric == "p99_ttft_ms" else 1
            cells += [_num(row.values[value][metric], digits) for value in ab.values]
            cells += [_change(row.changes[value][metric]) for value in ab.values[1:]]
        out.append("| " + " | ".join(cells) + " |")
    return out


def comparison_section(comparison: Comparison) -> list[str]:
    out = [f"## Against `{comparison.baseline}`", "",
           f"A level regresses when output tok/s is more than {comparison.threshold * 100:.0f} % lower, or TTFT "
           f"or TPOT p99 more than {comparison.threshold * 100:.0f} % higher.", "",
           "| level | output tok/s was / now | TTFT p99 was / now (ms) | TPOT p99 was / now (ms) | verdict |",
           "| --- | ---: | ---: | ---: | --- |"]
    for level in comparison.levels:
        name = f"{level.variant} c={level.concurrency}" if level.variant else f"c={level.concurrency}"
        if not level.comparable:
            out.append(f"| {name} | - | - | - | {_cell(level.note)} |")
            continue
        cells = []
        for delta in level.deltas:
            digits = 0 if delta.metric == "p99_ttft_ms" else 1
            cells.append(f"{_num(delta.old, digits)} / {_num(delta.new, digits)} ({_change(delta.change)})")
        verdict = f"**REGRESSION**: {level.worst()}" if level.regressed else "ok"
        out.append(f"| {name} | " + " | ".join(cells) + f" | {verdict} |")
    if comparison.unmatched:
        out += ["", f"Not in the baseline: concurrency {', '.join(str(c) for c in comparison.unmatched)}."]
    regressions = comparison.regressions
    out += ["", f"**{len(regressions)} level(s) regressed.**" if regressions
            else f"No level is more than {comparison.threshold * 100:.0f} % worse."]
    return out


def markdown(report: ReportInput) -> str:
    s = report.settings
    lengths = s.get("lengths") or f"input {s.get('input_len')} / output {s.get('output_len')} tokens"
    out = [f"# {report.title}", "",
           f"{s.get('started_at', '')}: `sglang.bench_serving --dataset-name random-ids`, {lengths}, "
           f"max(4 x concurrency, 32) prompts per level, request rate inf, against `{s.get('served_name')}` at "
           f"{s.get('url')}.", "",
           f"GPU sampling: {s.get('sampling', '-')}.", ""]
    if report.ab is not None:
        out += [*ab_section(report.ab), ""]
    for variant in variants(report.lines):
        lines = [line for line in report.lines if line["gpunode"].get("variant") == variant]
        heading = "## Levels" if variant is None else f"## Levels with `{lines[0]['gpunode'].get('ab_flag')} {variant}`"
        out += [heading, "", *level_table(lines), ""]
    if any("workers" in line["gpunode"] for line in report.lines):
        out += [*workers_section(report.lines), ""]
    if report.comparison is not None:
        out += [*comparison_section(report.comparison), ""]
    if report.roofline is not None:
        out += ["## Roofline (single-stream decode)", ""]
        out += [f"- {line}" for line in roofline_mod.describe(report.roofline)]
        out += ["", "The arithmetic is in `gpunode/bench/roofline.py`'s docstring.", ""]
    if report.plots:
        out += ["## Plots", ""] + [f"![{Path(name).stem}]({name})" for name in report.plots] + [""]
    if report.notes:
        out += ["## Notes", ""] + [f"- {_cell(note)}" for note in report.notes] + [""]
    return "\n".join(out)


# -- plots ---------------------------------------------------------------------------------------

def _series(lines: Sequence[dict[str, Any]], variant: str | None, pick: Any) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for line in sorted(lines, key=lambda item: item["gpunode"]["concurrency"]):
        if line["gpunode"].get("variant") != variant:
            continue
        value = pick(line)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            xs.append(line["gpunode"]["concurrency"])
            ys.append(float(value))
    return xs, ys


def plot(lines: Sequence[dict[str, Any]], folder: Path) -> tuple[list[str], str]:
    """Write the plots into ``folder``; (file names written, why some or all were skipped)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], "plots skipped: matplotlib is not installed (pip install 'gpunode[bench]')"
    written: list[str] = []
    skipped = ""
    names = variants(lines)

    def label(variant: str | None, what: str) -> str:
        return what if variant is None else f"{variant}: {what}"

    fig, ax = plt.subplots(figsize=(8, 5))
    drawn = False
    for index, variant in enumerate(names):
        color = f"C{index}"
        xs, ys = _series(lines, variant, lambda line: line.get("output_throughput"))
        if xs:
            ax.plot(xs, ys, "o-", color=color, label=label(variant, "output tok/s"))
            drawn = True
        xs, ys = _series(lines, variant, lambda line: line.get("total_throughput"))
        if xs:
            ax.plot(xs, ys, "s--", color=color, alpha=0.6, label=label(variant, "total tok/s"))
    if drawn:
        _concurrency_axis(ax, lines)
        ax.set_xlabel("concurrency (max in-flight requests)")
        ax.set_ylabel("tokens per second")
        ax.set_title("Throughput against concurrency")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(folder / THROUGHPUT_PNG, dpi=110)
        written.append(THROUGHPUT_PNG)
    else:
        skipped = "throughput plot skipped: no level has a result"
    plt.close(fig)

    has_power = any((line["gpunode"].get("gpu") or {}).get("mean_power_share") is not None for line in lines)
    if not has_power:
        # The set of files stays the same: power.png says why it has no curve.
        reasons = {str((line["gpunode"].get("gpu") or {}).get("reason") or "") for line in lines} - {""}
        why = f" ({'; '.join(sorted(reasons))})" if reasons else ""
        fig, ax = plt.subplots(figsize=(8, 5))
        ax.axis("off")
        ax.text(0.5, 0.5, "No GPU power readings" + (":\n" + "\n".join(sorted(reasons)) if reasons else ""),
                ha="center", va="center", wrap=True, fontsize=11)
        fig.savefig(folder / POWER_PNG, dpi=110)
        plt.close(fig)
        written.append(POWER_PNG)
        return written, "; ".join(filter(None, [skipped, f"power plot without curves: no power reading{why}"]))
    fig, ax = plt.subplots(figsize=(8, 5))
    util_ax = ax.twinx()
    for index, variant in enumerate(names):
        color = f"C{index}"
        xs, ys = _series(lines, variant, lambda line: _share_pct(line, "mean_power_share"))
        ax.plot(xs, ys, "o-", color=color, label=label(variant, "mean power"))
        xs, ys = _series(lines, variant, lambda line: _share_pct(line, "peak_power_share"))
        ax.plot(xs, ys, "^:", color=color, label=label(variant, "peak power"))
        xs, ys = _series(lines, variant, lambda line: (line["gpunode"].get("gpu") or {}).get("mean_util_pct"))
        util_ax.plot(xs, ys, "x--", color=color, alpha=0.5, label=label(variant, "GPU busy"))
    _concurrency_axis(ax, lines)
    ax.set_ylabel("power, % of the enforced limit (TDP)")
    util_ax.set_ylabel("GPU busy, % (NVML utilisation)")
    peaks = [_share_pct(line, "peak_power_share") for line in lines]
    ax.set_ylim(0, max([110.0] + [p + 10 for p in peaks if p is not None]))
    util_ax.set_ylim(0, 110)
    ax.set_title("GPU power and utilisation against concurrency")
    ax.grid(True, which="both", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    more_handles, more_labels = util_ax.get_legend_handles_labels()
    ax.legend(handles + more_handles, labels + more_labels, loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(folder / POWER_PNG, dpi=110)
    plt.close(fig)
    written.append(POWER_PNG)
    return written, skipped


def _concurrency_axis(ax: Any, lines: Sequence[dict[str, Any]]) -> None:
    """Log-2 concurrency axis labelled with the levels themselves (1, 10, 64 ... not 2^0)."""
    levels = sorted({line["gpunode"]["concurrency"] for line in lines})
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(level) for level in levels])
    ax.minorticks_off()
    ax.set_xlabel("concurrency (max in-flight requests)")


def _share_pct(line: dict[str, Any], key: str) -> float | None:
    value = (line["gpunode"].get("gpu") or {}).get(key)
    return None if value is None else float(value) * 100
