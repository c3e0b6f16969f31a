"""State a teaching claim, check it on this machine, print one line."""
from __future__ import annotations


class ClaimFailed(AssertionError):
    """A statement the course makes did not hold on this machine."""


def claim(statement: str, holds: bool, evidence: str = "") -> None:
    """Assert a teaching claim and print one checked line; raise ClaimFailed if it does not hold."""
    if not isinstance(statement, str) or not statement.strip():
        raise ValueError("claim() needs the statement as a non-empty string")
    if not isinstance(holds, bool):
        # A tensor or numpy bool would print fine but hides a broadcast mistake; be explicit.
        try:
            holds = bool(holds)
        except Exception as exc:  # a multi-element tensor, say
            raise TypeError(f"claim({statement!r}): 'holds' must be a single truth value, got {type(holds).__name__}") from exc
    suffix = f"  [{evidence}]" if evidence else ""
    if not holds:
        raise ClaimFailed(f"claim does not hold on this machine: {statement}{suffix}")
    print(f"✔ {statement}{suffix}")
