"""What a stage run returns: the one result type every stage and the Ansible module share; and what
one check returns (a smoke test's check of a server, a node check of `gpunode check`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# While a stage runs, the runner names a file in this variable; a stage appends its progress lines
# (the model stage's bytes, rate and ETA) and the runner shows the last one live.
PROGRESS_ENV = "GPUNODE_PROGRESS_FILE"


@dataclass
class StageResult:
    changed: bool = False
    failed: bool = False
    summary: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    cause: str | None = None  # why it failed, where the summary's first line is a note, not the cause
    unreachable: bool = False  # it failed because the machine it works on (or the Hub) did not answer

    def failure(self) -> str:
        """The failure's own message (the task's msg, hence the recap's and summary.json's)."""
        return self.cause or (self.summary[0] if self.summary else "failed")


@dataclass
class CheckResult:
    """One check's outcome. Each report keeps its own keys (smoke: ``smoke.report.check_as_dict``;
    `gpunode check`: ``checks.run.result_as_dict``)."""

    name: str  # the check
    status: str  # pass | fail | skip; a node check also pending (waits for a reload or reboot) or unreachable (not run)
    message: str = ""  # what it found: why it failed, was skipped or waits (a smoke check says it when it passes too)
    seconds: float = 0.0  # how long it took (smoke)
    data: dict[str, Any] = field(default_factory=dict)  # the numbers it read (smoke)
    layer: str = ""  # the check layer it belongs to (`gpunode check`)
    host: str = ""  # the inventory host it ran against (`gpunode check`)

    @property
    def failed(self) -> bool:
        return self.status == "fail"
