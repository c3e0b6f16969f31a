"""docs/decisions.md: every decision is there, each with a default and a link to the cell that measures it,
and every link resolves (a file that exists; a notebook heading JupyterLab would give that anchor)."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest
from notebook_rules import ROOT, machine_path_pattern
from test_links import BARE_REFERENCE, LINK, headings

PAGE = ROOT / "docs" / "decisions.md"
FENCE = re.compile(r"```.*?```", re.S)

# Each decision of issue 23, and words its heading must hold.
DECISIONS = {
    "workers": ("num_workers",),
    "pin_memory": ("pin_memory",),
    "where to normalise": ("normalise",),
    "precision": ("float32", "bf16", "float16", "GradScaler"),
    "compile or not": ("torch.compile", "eager"),
    "trace, script, export or ONNX": ("torch.jit.trace", "torch.jit.script", "torch.export", "ONNX"),
    "strict loading": ("strict",),
    "checkpoint contents": ("checkpoint",),
    "DDP or not, gloo or nccl": ("DDP", "one process", "gloo", "nccl"),
    "torch threads on a shared machine": ("threads", "never idle"),
}


def link_problems(page: Path) -> list[str]:
    """Links that do not resolve: a relative file that is missing, or a notebook anchor no heading gives."""
    problems = []
    for text, target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        if target.startswith(("/", "file:")) or re.match(r"[A-Za-z]:[\\/]", target):
            problems.append(f"[{text}]({target}): an absolute link")
            continue
        file, _, fragment = target.partition("#")
        other = (page.parent / unquote(file)).resolve() if file else page
        if not other.exists():
            problems.append(f"[{text}]({target}): no file {file}")
        elif fragment and other.suffix == ".ipynb" and unquote(fragment) not in headings(other):
            problems.append(f"[{text}]({target}): no heading with that anchor in {other.name}")
    return problems


def sections(page: Path) -> dict[str, str]:
    """The page's `## ` headings, each with the text below it up to the next one."""
    parts = re.split(r"^## (.+)$", FENCE.sub("", page.read_text(encoding="utf-8")), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_link_resolves():
    assert link_problems(PAGE) == []


@pytest.mark.parametrize("decision", DECISIONS, ids=lambda d: d.replace(" ", "-"))
def test_each_decision_has_a_heading_a_default_and_a_measuring_cell(decision):
    words = DECISIONS[decision]
    found = [h for h in sections(PAGE) if all(w.lower() in h.lower() for w in words)]
    assert len(found) == 1, f"one heading naming {words}, found {found} among {list(sections(PAGE))}"
    body = sections(PAGE)[found[0]]
    assert re.search(r"^\| Default \|", body, re.M), f"{found[0]}: no Default row"
    assert re.search(r"^\| Decided by \|", body, re.M), f"{found[0]}: no row for the measurement that decides it"
    assert re.search(r"^\| Measured in \|.*\]\(\.\./notebooks/\d\d_\w+\.ipynb#", body, re.M), \
        f"{found[0]}: no link to the notebook section that measures it"


def test_no_absolute_path_of_this_machine():
    text = PAGE.read_text(encoding="utf-8")
    assert not machine_path_pattern().search(text)
    assert not re.search(r"(?<![\w.])/(home|Users|root|tmp|work|mnt)/|[A-Za-z]:\\\\", text)


def test_no_bare_section_or_chapter_number_outside_a_link():
    prose = FENCE.sub("", PAGE.read_text(encoding="utf-8"))
    bare = [m.group(0) for line in prose.splitlines() if not line.startswith("#")
            for m in BARE_REFERENCE.finditer(LINK.sub("", line))]
    assert bare == []


def test_the_check_fails_on_a_broken_link(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (tmp_path / "notebooks").symlink_to(ROOT / "notebooks")
    good = "[chapter 3, section 6](../notebooks/03_data.ipynb#6.-num_workers:-loading-in-parallel)"
    page = docs / "decisions.md"
    page.write_text(f"{good}\n[ch 1](../notebooks/01_tensors.ipynb#Pitfall:-a-%28C,%29-channel-mean-against-a-"
                    f"%28B,-C,-H,-W%29-batch)\n")
    assert link_problems(page) == []
    page.write_text(f"{good}\n[gone](../notebooks/03_data.ipynb#6.-num-workers)\n[none](../notebooks/99_x.ipynb)\n"
                    "[abs](/tmp/x.md)\n")
    assert link_problems(page) == [
        "[gone](../notebooks/03_data.ipynb#6.-num-workers): no heading with that anchor in 03_data.ipynb",
        "[none](../notebooks/99_x.ipynb): no file ../notebooks/99_x.ipynb",
        "[abs](/tmp/x.md): an absolute link"]
