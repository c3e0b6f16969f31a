"""Chapter 5's reader of a hashed requirements lock (`pip install --require-hashes -r requirements.lock`).

It reads what chapter 5 checks in the repository's own lock: every requirement pinned with `==` and
listing at least one hash, and the environment markers (Python version, platform) under which a pin applies.
It is a reader for pip-compile and `uv pip compile --generate-hashes` output, not a full requirements parser.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from ptlab.course.doctor import LOCK_FILE  # the checkout's requirements.lock, found from ptlab's own location

# Options that apply to the whole file, not to one requirement: they pin nothing and are skipped.
GLOBAL_OPTIONS = ("--index-url", "--extra-index-url", "--find-links", "--trusted-host", "--no-binary",
                  "--only-binary", "--prefer-binary", "--require-hashes", "--pre", "--no-index", "-i ", "-f ")
_SPEC = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?\s*(?P<op>===|==|~=|!=|<=|>=|<|>|@)?"
                   r"\s*(?P<version>[^\s;]*)\s*(?:;\s*(?P<marker>.*))?$")
_HASH = re.compile(r"--hash[=\s]+(?P<algo>[a-z0-9]+):(?P<hex>[0-9a-fA-F]+)")

__all__ = ["LOCK_FILE", "LockedRequirement", "read_lock"]


@dataclass(frozen=True)
class LockedRequirement:
    """One requirement of a lock: its name, `==` version (None if not pinned so), marker, hashes, first line."""

    name: str
    version: str | None
    marker: str | None
    hashes: tuple[str, ...]
    line: int

    @property
    def pinned(self) -> bool:
        """Pinned to one version with `==` and at least one sha256 hash, as uv writes them
        (pip also accepts sha384 and sha512)."""
        return self.version is not None and any(h.startswith("sha256:") for h in self.hashes)


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) of each logical line: comments dropped, backslash continuations joined."""
    out, parts, start = [], [], 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = re.sub(r"(^|\s)#.*$", "", raw).rstrip()
        if not parts:
            start = number
        if line.endswith("\\"):
            parts.append(line[:-1].strip())
            continue
        parts.append(line.strip())
        joined = " ".join(p for p in parts if p)
        if joined:
            out.append((start, joined))
        parts = []
    if parts and any(parts):
        out.append((start, " ".join(p for p in parts if p)))
    return out


def read_lock(path: str | Path = LOCK_FILE) -> list[LockedRequirement]:
    """The requirements of a hashed lock file, in file order; a requirement not pinned with == has version None."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no lock file at {path}: pass the path of a requirements.lock")
    found = []
    for number, line in _logical_lines(path.read_text(encoding="utf-8")):
        if line.startswith(GLOBAL_OPTIONS):
            continue
        hashes = tuple(f"{m['algo']}:{m['hex'].lower()}" for m in _HASH.finditer(line))
        spec = _HASH.sub("", line).strip()
        match = _SPEC.match(spec) if not spec.startswith("-") else None   # -e, -r, -c: pins nothing
        if match is None:
            found.append(LockedRequirement(spec, None, None, hashes, number))
            continue
        exact = match["op"] in ("==", "===") and match["version"] and "*" not in match["version"]
        found.append(LockedRequirement(re.sub(r"[-_.]+", "-", match["name"].lower()),
                                       match["version"] if exact else None,
                                       (match["marker"] or "").strip() or None, hashes, number))
    return found
