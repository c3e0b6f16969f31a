"""Private to ptlab.watch: what it hands back (one finding per pitfall seen, the report that holds them) and the rule
that marks a finding as the consequence of another one."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any

@dataclass
class WatchFinding:
    """One pitfall observed: its registry id, what was measured, where in the learner's code, and how sure it is.

    `certain` findings set exit status 1; a hint (certain=False) is printed and leaves it 0. A finding that another
    one explains names it in `consequence_of` and does not count as a cause.
    """

    pitfall: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    where: str | None = None
    certain: bool = True
    consequence_of: str | None = None
    since: int = 0                  # the optimizer step from which the sign showed (orders causes and consequences)
    # a cause that can explain loss signs: the step from which it was measured large enough to (the piled-up
    # gradient >= 3x the norm of its step's own gradient); None: it explains nothing, every other finding stays a cause
    explains_from: int | None = None
    why_consequence: str = ""

    @property
    def kind(self) -> str:
        """'cause' (counts: exit 1), 'hint' (printed, exit 0) or 'consequence' (explained by another finding)."""
        return "consequence" if self.consequence_of else ("cause" if self.certain else "hint")

    def to_json(self) -> dict[str, Any]:
        """The JSON record: pitfall, kind, message, evidence (with `where` and the command that reproduces it)."""
        evidence = dict(self.evidence)
        if self.where:
            evidence["where"] = self.where
        evidence["reproduce"] = f"python -m ptlab pitfalls run {self.pitfall}"
        record = {"pitfall": self.pitfall, "kind": self.kind, "message": self.message, "evidence": evidence}
        if self.consequence_of:
            record["consequence_of"] = self.consequence_of
            record["why_consequence"] = self.why_consequence
        return record


def mark_consequences(findings: list[WatchFinding], explains: dict[str, set[str]],
                      may_explain: dict[str, set[str]] | None = None) -> list[WatchFinding]:
    """Mark each finding that a certain finding explains (`explains`: cause -> the ids it can explain), only where
    what was measured says so: the cause had grown large (`explains_from`) at a step before the sign began. Causes
    first, then consequences, then hints."""
    causes = [f for f in findings if f.certain]
    for finding in findings:
        cause = next((c for c in causes if c is not finding and finding.pitfall in explains.get(c.pitfall, ())
                      and c.explains_from is not None and c.explains_from < finding.since
                      and c.consequence_of is None), None)
        if cause is not None:
            finding.consequence_of = cause.pitfall
            finding.why_consequence = (f"the piled-up gradient's norm was >= 3x that of its step's own gradient "
                                       f"from step {cause.explains_from}, before this began at step {finding.since}")
            continue
        other = next((c for c in causes if c is not finding and c.certain and c.since <= max(finding.since, 1)
                      and finding.pitfall in (may_explain or {}).get(c.pitfall, ())), None)
        if other is not None and finding.certain:      # it may be that cause's doing: nothing measured which
            finding.certain = False
            finding.message += (f" ({other.pitfall}, found above, can do this too, and nothing here measured "
                                f"which one did)")
    order = {"cause": 0, "consequence": 1, "hint": 2}
    return sorted(findings, key=lambda f: order[f.kind])


@dataclass
class Report:
    """What one watch found: filled in when the watch ends; `print(report)` shows it."""

    findings: list[WatchFinding] = field(default_factory=list)
    steps_observed: int = 0
    script_failed: bool = False
    looked_for: list[str] = field(default_factory=list)

    @property
    def pitfalls(self) -> list[str]:
        """The ids found (causes, consequences and hints), in the order printed."""
        return [f.pitfall for f in self.findings]

    @property
    def causes(self) -> list[WatchFinding]:
        """The findings that set exit status 1: certain, and not explained by another finding."""
        return [f for f in self.findings if f.kind == "cause"]

    @property
    def exit_status(self) -> int:
        """2 the script failed, 1 a certain finding, 0 none (hints alone leave it 0; a consequence comes with its
        cause)."""
        return 2 if self.script_failed else (1 if self.causes else 0)

    def to_json(self) -> dict[str, Any]:
        """{"findings": [{"pitfall", "kind", "message", "evidence"}], "steps_observed": N, "looked_for": [ids]}."""
        return {"findings": [f.to_json() for f in self.findings], "steps_observed": self.steps_observed,
                "looked_for": list(self.looked_for)}

    def _looked_for(self) -> str:
        ids = ", ".join(self.looked_for)
        return textwrap.fill(f"It watches for the signs of {len(self.looked_for)} pitfalls ({ids}); it does not see "
                             f"other bugs, so this is not a verdict that the script is correct.", 116,
                             initial_indent="  ", subsequent_indent="  ")

    def __str__(self) -> str:
        head = f"ptlab watch: {self.steps_observed} optimizer steps observed, "
        if not self.findings:
            return head + "no pitfall found\n" + self._looked_for()
        causes = self.causes
        consequences = [f for f in self.findings if f.kind == "consequence"]
        hints = [f for f in self.findings if f.kind == "hint"]
        parts = [f"{len(causes)} pitfall(s) found"] if causes else ["no pitfall found for certain"]
        if consequences:
            parts.append(f"{len(consequences)} consequence(s) of them")
        if hints:
            parts.append(f"{len(hints)} hint(s) (exit status 0 for these)")
        lines = [head + ", ".join(parts)]
        for title, group in (("", causes), ("consequences of the above (not counted as causes):", consequences),
                             ("hints (what ran cannot tell a bug from intent; check them):", hints)):
            if group and title:
                lines.append(title)
            for f in group:
                because = f" [a consequence of {f.consequence_of}: {f.why_consequence}]" if f.consequence_of else ""
                lines.append(f"- {f.pitfall}:{because} {f.message}")
                if f.where:
                    lines.append(f"    at {_shown_place(f.where)}")
                lines.append(f"    reproduce: python -m ptlab pitfalls run {f.pitfall}")
        if not causes:
            lines.append(self._looked_for())
        return "\n".join(lines)

    def __repr__(self) -> str:          # a notebook shows the report as it prints
        return str(self)


def _shown_place(where: str) -> str:
    """`file:line`, or "this notebook cell, line N" for a Jupyter cell (its code lives in a temporary file)."""
    path, _, line = where.rpartition(":")
    if "ipykernel_" in path and line.isdigit():
        return f"this notebook cell, line {line}"
    return where
