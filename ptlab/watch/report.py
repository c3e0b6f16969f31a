"""Private to ptlab.watch: what it hands back, one finding per pitfall seen and the report that holds them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class WatchFinding:
    """One pitfall observed: its registry id, what was measured, and where in the learner's code."""

    pitfall: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    where: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The JSON record: pitfall, message, evidence (with `where` and the command that reproduces it)."""
        evidence = dict(self.evidence)
        if self.where:
            evidence["where"] = self.where
        evidence["reproduce"] = f"python -m ptlab pitfalls run {self.pitfall}"
        return {"pitfall": self.pitfall, "message": self.message, "evidence": evidence}


@dataclass
class Report:
    """What one watch found: filled in when the watch ends; `print(report)` shows it."""

    findings: list[WatchFinding] = field(default_factory=list)
    steps_observed: int = 0
    script_failed: bool = False

    @property
    def pitfalls(self) -> list[str]:
        """The ids found, in order."""
        return [f.pitfall for f in self.findings]

    def to_json(self) -> dict[str, Any]:
        """{"findings": [{"pitfall", "message", "evidence"}], "steps_observed": N}."""
        return {"findings": [f.to_json() for f in self.findings], "steps_observed": self.steps_observed}

    def __str__(self) -> str:
        head = f"ptlab watch: {self.steps_observed} optimizer steps observed, "
        if not self.findings:
            return head + "no pitfall found"
        lines = [head + f"{len(self.findings)} pitfall(s) found"]
        for f in self.findings:
            lines.append(f"- {f.pitfall}: {f.message}")
            if f.where:
                lines.append(f"    at {f.where}")
            lines.append(f"    reproduce: python -m ptlab pitfalls run {f.pitfall}")
        return "\n".join(lines)

    def __repr__(self) -> str:          # a notebook shows the report as it prints
        return str(self)
