"""A finding: what one check found, in one vocabulary for every stage that judges something (the
host's preflight and fabric, the model's verify, the image's verify, p2p's verdict, serve's
diagnosis of a log).

Stdlib only and nothing of gpunode: the p2p stage ships this file into the server image beside the
p2p package. Each stage keeps the JSON keys its records and commands always had, through its own
serializer (``as_dict`` with its key names).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"
SEVERITIES = (OK, INFO, WARN, FAIL)


@dataclass(frozen=True)
class Finding:
    """One thing a check found.

    - ``code``: the stable identifier automation matches on (``hmm``, ``sha256``, ``p2p-unavailable``,
      ``pin torch``, ``cuda_oom``);
    - ``severity``: ``ok`` (checked, fine), ``info`` (worth knowing), ``warn`` (works, not as it
      should), ``fail`` (wrong);
    - ``message``: what was found, in words;
    - ``subject``: what it is about, where the code does not say (a file, ``GPU0``, ``GPU0->GPU1``,
      ``node``);
    - ``cause``: why it happens, where known;
    - ``fix``: what to do about it;
    - ``evidence``: the line (of a log) that showed it;
    - ``blocking``: it stops the stage before it changes anything;
    - ``category``: the kind of problem, where a verdict treats kinds apart (p2p: environment,
      data, p2p, node, info).
    """

    code: str
    severity: str
    message: str
    subject: str | None = None
    cause: str | None = None
    fix: str | None = None
    evidence: str | None = None
    blocking: bool = False
    category: str | None = None

    @property
    def ok(self) -> bool:
        """Checked and found as it should be."""
        return self.severity == OK

    def line(self, *, severity: bool = False, fix: bool = False) -> str:
        """The one-line form, ``code subject: message``; with ``severity`` led by it (``FAIL``), with
        ``fix`` followed by `` -> fix: ...`` where there is one and the finding is not ok."""
        text = " ".join(part for part in (self.code, self.subject) if part) + f": {self.message}"
        if severity:
            text = f"{self.severity.upper():4} {text}"
        if fix and self.fix and self.severity != OK:
            text += f" -> fix: {self.fix}"
        return text

    def as_dict(self, keys: Mapping[str, str] | None = None) -> dict[str, Any]:
        """The fields as plain data: all of them under their own names, or those ``keys`` names,
        in its order, each under the key it maps to (a record's own, older key)."""
        names = keys or {f.name: f.name for f in fields(self)}
        return {key: getattr(self, name) for name, key in names.items()}
