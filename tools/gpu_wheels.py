"""`make gpu-wheels`: a wheelhouse of what a GPU machine lacks to run `python -m ptlab gpu-check`.

A borrowed GPU machine has its own torch and torchvision (a CUDA torch wheel is too large to carry) and cannot reach
PyPI. This takes the packages named on the command line and everything they need, at the versions pinned in
requirements.lock (read through its `# via` lines), leaves out torch, torchvision and everything they pull in (the
machine has those, at its own versions), and downloads the wheels for CPython 3.12 on manylinux x86-64 and for the
Python running this script. It writes DEST/requirements.txt, the pins it carried, and prints the wheelhouse's size.
There: `pip install --no-index --find-links .gpu-wheels -r .gpu-wheels/requirements.txt`.
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker, default_environment

THE_MACHINES_OWN = ("torch", "torchvision")  # and everything the lock says they pull in
NEVER = re.compile(r"^(torch|torchvision|triton|nvidia-.*|cuda-.*)$")
TARGET_ENV = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
              "implementation_name": "cpython", "platform_python_implementation": "CPython", "os_name": "posix",
              "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
TARGET_PIP = ["--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
              *[arg for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
                for arg in ("--platform", tag)]]
LIMIT_MIB = 40.0  # the whole tree carried to a GPU machine is limited to 64 MiB


@dataclass
class Pin:
    """One entry of the lock: `name==version ; marker`, its hashes and the packages it is there for."""

    name: str
    spec: str
    marker: str | None
    hashes: list[str] = field(default_factory=list)
    needed_by: set[str] = field(default_factory=set)

    def applies(self, env: dict[str, str]) -> bool:
        """True when this pin is the one the lock installs in `env`."""
        return self.marker is None or Marker(self.marker).evaluate(env)


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> list[Pin]:
    """Every entry of a `uv pip compile --generate-hashes` lock, with its `# via` parents."""
    pins: list[Pin] = []
    via = False
    for line in path.read_text(encoding="utf-8").splitlines():
        text = line.strip().rstrip("\\").strip()
        if line[:1].isalnum():
            spec, _, marker = text.partition(";")
            pins.append(Pin(canonical(spec.split("==")[0]), spec.strip(), marker.strip() or None))
            via = False
        elif text.startswith("--hash=") and pins:
            pins[-1].hashes.append(text)
        elif text.startswith("# via"):
            via = True
            parent = text[len("# via"):].strip()
            if parent:
                pins[-1].needed_by.add(parent)
        elif via and text.startswith("#") and pins:
            pins[-1].needed_by.add(text.lstrip("#").strip())
    for pin in pins:
        pin.needed_by = {canonical(p) for p in pin.needed_by if not p.startswith("-r ")}
    return pins


def closure(pins: list[Pin], roots: set[str]) -> set[str]:
    """The roots and every package the lock says one of them (transitively) needs."""
    needed = {canonical(r) for r in roots}
    while True:
        more = {p.name for p in pins if p.needed_by & needed} - needed
        if not more:
            return needed
        needed |= more


def carried(pins: list[Pin], roots: list[str], env: dict[str, str]) -> list[Pin]:
    """The pins to carry for `env`: the roots' closure less the machine's own torch, torchvision and their needs."""
    applicable = [p for p in pins if p.applies(env)]
    unknown = {canonical(r) for r in roots} - {p.name for p in applicable}
    if unknown:
        raise SystemExit(f"gpu-wheels: not in the lock for this target: {', '.join(sorted(unknown))}")
    present = closure(applicable, set(THE_MACHINES_OWN))
    keep = closure(applicable, set(roots)) - present
    return sorted((p for p in applicable if p.name in keep and not NEVER.match(p.name)), key=lambda p: p.name)


def download(pins: list[Pin], dest: Path, target_args: list[str]) -> None:
    """pip download the pinned wheels, hashes checked, no dependency resolution (the lock did it)."""
    reqs = dest / ".download.txt"
    reqs.write_text("".join(f"{p.spec} {' '.join(p.hashes)}\n" for p in pins), encoding="utf-8")
    try:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
                        "--only-binary=:all:", "--require-hashes", "-d", str(dest), *target_args, "-r", str(reqs)],
                       check=True)
    finally:
        reqs.unlink()


def main(argv: list[str] | None = None) -> int:
    """Build the wheelhouse; exit 1 when it is over LIMIT_MIB."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", help="what to carry (with what it needs, less torch's own)")
    parser.add_argument("--lock", default="requirements.lock")
    parser.add_argument("--dest", default=".gpu-wheels")
    parser.add_argument("--gpu-only", action="store_true", help="only CPython 3.12's wheels, not this Python's")
    args = parser.parse_args(argv)
    pins, dest = read_lock(Path(args.lock)), Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    targets = {"CPython 3.12, manylinux x86-64": (TARGET_ENV, TARGET_PIP)}
    if not args.gpu_only and (sys.version_info[:2] != (3, 12) or sys.platform != "linux"):
        targets[f"this Python ({sys.version_info.major}.{sys.version_info.minor})"] = (default_environment(), [])
    listed: dict[str, Pin] = {}
    for label, (env, pip_args) in targets.items():
        pins_here = carried(pins, args.packages, env)
        print(f"{label}: {len(pins_here)} wheels")
        download(pins_here, dest, pip_args)
        listed.update({p.spec: p for p in pins_here})
    lines = [f"{p.spec} ; {p.marker}" if p.marker else p.spec for p in listed.values()]
    (dest / "requirements.txt").write_text("\n".join(sorted(set(lines))) + "\n", encoding="utf-8")
    size = sum(f.stat().st_size for f in dest.glob("*.whl")) / 2**20
    print(f"{dest}: {len(list(dest.glob('*.whl')))} wheels, {size:.1f} MiB (limit {LIMIT_MIB:.0f} MiB); there:\n"
          f"  pip install --no-index --find-links {dest} -r {dest}/requirements.txt && python -m ptlab gpu-check")
    if size > LIMIT_MIB:
        print(f"gpu-wheels: {size:.1f} MiB is over {LIMIT_MIB:.0f} MiB; carry fewer packages (GPU_WHEELS=...)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
