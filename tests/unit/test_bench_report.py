"""The comparison, the A/B table and the report, from the result file the real sampler wrote on the
H200 (tests/fixtures/bench/h200_e2e_results.jsonl)."""

from __future__ import annotations

import builtins
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from gpunode.bench import compare, report, roofline

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "h200_e2e_results.jsonl"


@pytest.fixture
def lines() -> list[dict[str, Any]]:
    return compare.load_results(FIXTURE)


def scaled(lines: list[dict[str, Any]], **factors: float) -> list[dict[str, Any]]:
    """The recorded lines with metrics multiplied: a derived run, to judge against the recorded one."""
    out = copy.deepcopy(lines)
    for line in out:
        for metric, factor in factors.items():
            line[metric] *= factor
    return out


@pytest.mark.recording
def test_the_recorded_file(lines: list[dict[str, Any]]) -> None:
    assert [line["gpunode"]["concurrency"] for line in lines] == [1, 4]
    for line in lines:
        gpu = line["gpunode"]["gpu"]
        assert gpu["available"] and gpu["finding_kind"] == "power-capped"
        assert gpu["mean_power_share"] > 0.95 and gpu["gpus"][0]["name"] == "NVIDIA H200"
        assert line["completed"] == 32 and line["gpunode"]["ok"]


def test_against_itself_nothing_regresses(lines: list[dict[str, Any]]) -> None:
    result = compare.compare(lines, lines, "h200")
    assert result.regressions == [] and result.unmatched == []
    assert all(level.comparable and all(d.change == 0 for d in level.deltas) for level in result.levels)


def test_more_than_ten_percent_worse_is_a_regression(lines: list[dict[str, Any]]) -> None:
    assert compare.compare(scaled(lines, output_throughput=0.91), lines).regressions == []
    slower = compare.compare(scaled(lines, output_throughput=0.85), lines)
    assert [(lc.variant, lc.concurrency) for lc in slower.regressions] == [(None, 1), (None, 4)]
    assert slower.regressions[0].worst() == "output tok/s -15.0 %"
    late = compare.compare(scaled(lines, p99_ttft_ms=1.2, p99_tpot_ms=1.05), lines)
    assert late.regressions[0].worst() == "TTFT p99 +20.0 %"
    # Better is never a regression.
    assert compare.compare(scaled(lines, output_throughput=2.0, p99_tpot_ms=0.5), lines).regressions == []


def test_other_lengths_are_not_comparable(lines: list[dict[str, Any]]) -> None:
    other = copy.deepcopy(lines)
    other[0]["gpunode"]["input_len"] = 256
    result = compare.compare(scaled(other, output_throughput=0.5), lines)
    first = result.levels[0]
    assert not first.comparable and not first.regressed and "input/output 256/64 here, 32/64" in first.note
    assert [lc.concurrency for lc in result.regressions] == [4]


def test_ab_run_against_a_plain_baseline(lines: list[dict[str, Any]]) -> None:
    ab = copy.deepcopy(lines)
    for line in ab:
        line["gpunode"]["variant"], line["gpunode"]["ab_flag"] = "flashinfer_cutlass", "--moe-runner-backend"
    assert len(compare.compare(ab, lines).levels) == 2  # matched on concurrency


def test_load_results_errors(tmp_path: Path) -> None:
    for content, message in (("", "no level in it"), ("{", "not JSON"), ('{"gpunode": {}}\n', "no gpunode.concurrency")):
        path = tmp_path / "r.jsonl"
        path.write_text(content)
        with pytest.raises(compare.ResultFileError, match=message):
            compare.load_results(path)
    with pytest.raises(compare.ResultFileError, match="cannot read"):
        compare.load_results(tmp_path / "none.jsonl")


def test_ab_table_with_a_missing_level(lines: list[dict[str, Any]]) -> None:
    a = copy.deepcopy(lines)
    b = scaled(lines, output_throughput=0.5)[:1]
    for line in a:
        line["gpunode"]["variant"] = "A"
    for line in b:
        line["gpunode"]["variant"] = "B"
    table = compare.ab_table(a + b, "--flag", ["A", "B"])
    assert [row.concurrency for row in table.rows] == [1, 4]
    assert table.rows[0].changes["B"]["output_throughput"] == pytest.approx(-0.5)
    assert table.rows[1].values["B"]["output_throughput"] is None and table.rows[1].changes["B"]["p99_tpot_ms"] is None
    text = "\n".join(report.ab_section(table))
    assert "| 1 | 461.9 | 231.0 | -50.0 % |" in text and "| 4 | 1,825.7 | - | - |" in text


def test_markdown_from_the_recorded_lines(lines: list[dict[str, Any]]) -> None:
    text = report.markdown(report.ReportInput(
        title="gpunode bench: glm-5", lines=lines,
        settings={"input_len": 32, "output_len": 64, "url": "http://x", "served_name": "glm-5", "started_at": "t",
                  "sampling": "NVML"},
        comparison=compare.compare(scaled(lines, output_throughput=0.8), lines, "before.jsonl"),
        roofline=roofline.compute(allreduce_us=13.0), plots=["throughput.png"], notes=["a | note"]))
    assert "| 1 | 32 | 0 | 7.22 | 461.9 | 692.9 | 3 / 4 | 2.1 / 2.2 | 99 % / 106 % | 99 % | power-capped: GPU 0" in text
    assert "## Against `before.jsonl`" in text and "461.9 / 369.5 (-20.0 %)" in text
    assert "**2 level(s) regressed.**" in text and "**138 tok/s**" in text
    assert "![throughput](throughput.png)" in text and "- a \\| note" in text


def test_plots_without_matplotlib(lines: list[dict[str, Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    written, why = report.plot(lines, tmp_path)
    assert written == [] and why == "plots skipped: matplotlib is not installed (pip install 'gpunode[bench]')"


def test_plots_from_the_recorded_lines(lines: list[dict[str, Any]], tmp_path: Path) -> None:
    import matplotlib  # noqa: F401 - declared (the bench extra): a broken install fails, never skips
    written, why = report.plot(lines, tmp_path)
    assert written == ["throughput.png", "power.png"] and why == ""
    failed = [{"gpunode": {**line["gpunode"], "gpu": None}} for line in lines]
    (tmp_path / "x").mkdir()
    written, why = report.plot(failed, tmp_path / "x")
    # No curve to draw: power.png is still written and says why, so a report always has both files.
    assert written == ["power.png"] and "no level has a result" in why and "no power reading" in why


def test_recorded_file_is_json_lines() -> None:
    for raw in FIXTURE.read_text().splitlines():
        assert isinstance(json.loads(raw), dict)
