"""The smoke test's findings: one result per check, timings, and the exit code; as JSON or text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TextIO

from gpunode.ground.result import CheckResult


def check_as_dict(check: CheckResult) -> dict[str, Any]:
    """One check as the smoke record keeps it (its message under ``detail``)."""
    out: dict[str, Any] = {"name": check.name, "status": check.status, "ok": check.status == "pass",
                           "detail": check.message, "seconds": round(check.seconds, 3)}
    if check.data:
        out["data"] = check.data
    return out


@dataclass
class SmokeReport:
    url: str
    served_name: str
    checks: list[CheckResult] = field(default_factory=list)
    timings: dict[str, float | None] = field(default_factory=dict)
    exit_code: int = 0
    environment_problem: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def as_dict(self) -> dict[str, Any]:
        return {"url": self.url, "served_name": self.served_name, "ok": self.ok, "exit_code": self.exit_code,
                "environment_problem": self.environment_problem or None,
                "timings": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.timings.items()},
                "checks": [check_as_dict(check) for check in self.checks]}


def _fmt(value: float | None, unit: str, scale: float = 1.0, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value * scale:.{digits}f} {unit}"


def render_text(report: SmokeReport, out: TextIO) -> None:
    out.write(f"smoke {report.url} ({report.served_name})\n")
    width = max((len(check.name) for check in report.checks), default=8)
    for check in report.checks:
        out.write(f"  {check.status.upper():4}  {check.name:<{width}}  {check.message}"
                  f"{f'  [{check.seconds:.2f} s]' if check.seconds else ''}\n")
    t = report.timings
    out.write(f"timings: TTFT {_fmt(t.get('ttft_s'), 'ms', 1000, 0)}, single stream "
              f"{_fmt(t.get('decode_tok_s'), 'tok/s')}, total {_fmt(t.get('total_s'), 's')} "
              f"(server {_fmt(t.get('server_s'), 's')}, own overhead {_fmt(t.get('overhead_s'), 's', digits=2)})\n")
    if report.environment_problem:
        out.write(f"environment: {report.environment_problem}\n")
    passed = sum(check.status == "pass" for check in report.checks)
    verdict = "PASS" if report.ok else "FAIL"
    out.write(f"result: {verdict} ({passed}/{len(report.checks)} checks passed)\n")


def emit(report: SmokeReport, as_json: bool, out: TextIO) -> None:
    if as_json:
        json.dump(report.as_dict(), out, indent=2)
        out.write("\n")
    else:
        render_text(report, out)
    out.flush()
