"""The thread rule (README, "Threads"): every command that runs torch starts it with OMP_WAIT_POLICY=PASSIVE
unless the user set a policy; the Makefile, the notebook runner, pytest's kernels and CI all follow it."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from ptlab.course.nbrun import THREAD_DEFAULTS, kernel_env

ROOT = Path(__file__).resolve().parents[2]
MAKEFILE = ROOT / "Makefile"
# Every target whose recipe runs torch (directly, through pytest or through JupyterLab's kernels).
TORCH_TARGETS = ("lab", "doctor", "test", "test-fast", "test-unit", "test-notebooks", "test-second-config",
                 "test-browser", "notebooks", "bench", "bench-busy", "bench-avx2", "gpu-check", "catalogue")


def _policy_in_recipe(env: dict[str, str], *make_args: str) -> str:
    """OMP_WAIT_POLICY as a recipe of this Makefile sees it (a probe rule added with --eval)."""
    probe = "thread-rule-probe: ; @echo \"policy=$${OMP_WAIT_POLICY-unset}\""
    run = subprocess.run(["make", "-s", "-f", str(MAKEFILE), f"--eval={probe}", *make_args, "thread-rule-probe"],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return run.stdout.strip().removeprefix("policy=")


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_every_make_recipe_gets_passive_and_a_users_own_policy_wins():
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    assert _policy_in_recipe(base) == "PASSIVE"
    assert _policy_in_recipe({**base, "OMP_WAIT_POLICY": "ACTIVE"}) == "ACTIVE"
    assert _policy_in_recipe(base, "OMP_WAIT_POLICY=ACTIVE") == "ACTIVE"


def test_no_make_recipe_unsets_or_replaces_the_policy():
    """The probe shows the export; this catches a target that would drop it for its own command."""
    text = MAKEFILE.read_text()
    recipes = [line for line in text.splitlines() if line.startswith("\t")]
    assert not [line for line in recipes if "OMP_WAIT_POLICY" in line or re.search(r"\benv\s+-i\b|env -u", line)]
    assert re.search(r"^OMP_WAIT_POLICY \?= PASSIVE$", text, re.M)
    assert re.search(r"^export OMP_WAIT_POLICY$", text, re.M)
    assert THREAD_DEFAULTS == {"OMP_WAIT_POLICY": "PASSIVE"}          # the Makefile's default, in Python
    targets = set(re.findall(r"^([a-z0-9-]+):", text, re.M))
    assert set(TORCH_TARGETS) <= targets, set(TORCH_TARGETS) - targets


def test_kernels_get_passive_unless_the_user_set_a_policy(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert kernel_env()["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert kernel_env()["OMP_WAIT_POLICY"] == "ACTIVE"


def test_ci_runs_torch_only_through_make_targets():
    """.ci/run inherits the rule from the Makefile: no line of it starts Python or pytest itself."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [line for line in lines if line and not line.startswith("#")]
    assert [c for c in commands if c.startswith("make ")] == ["make test", "make test-second-config",
                                                              "make test-browser"]
    assert not [c for c in commands if re.search(r"\b(python3?|pytest|jupyter)\b", c)]


def test_pytest_gives_its_kernels_the_rule():
    """conftest.py sets the defaults before nbval or the browser tests start a kernel or JupyterLab."""
    assert os.environ.get("OMP_WAIT_POLICY")                            # set by make, by the user or by conftest
    source = (ROOT / "conftest.py").read_text()
    assert "THREAD_DEFAULTS" in source and "setdefault" in source
