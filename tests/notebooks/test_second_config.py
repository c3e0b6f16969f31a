"""The CI gate has teeth: the second configuration really changes float results, and the Makefile runs it."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ptlab.course.nbrun import SECOND_CONFIG

ROOT = Path(__file__).resolve().parents[2]

TRAIN_A_LITTLE = """
import torch
from torch.nn import functional as F
from ptlab.data import load_arrays, to_nchw
from ptlab.models import SmallCNN
images, labels = load_arrays(True)
X = to_nchw(images[:64]).float() / 255   # (64, 3, 32, 32)
y = torch.from_numpy(labels[:64].copy()).long()
torch.manual_seed(0)
model = SmallCNN(width=16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(5):
    loss = F.cross_entropy(model(X), y)
    opt.zero_grad(); loss.backward(); opt.step()
print(torch.get_num_threads(), torch.backends.cpu.get_cpu_capability(), repr(loss.item()))
"""


def _train(extra_env: dict[str, str]) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in SECOND_CONFIG}
    out = subprocess.run([sys.executable, "-c", TRAIN_A_LITTLE], env={**env, **extra_env}, cwd=ROOT,
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return out.split()


def test_makefile_runs_the_second_configuration_ptlab_names():
    makefile = (ROOT / "Makefile").read_text()
    line = re.search(r"^SECOND_CONFIG := (.*)$", makefile, re.M).group(1)
    assert dict(pair.split("=") for pair in line.split()) == SECOND_CONFIG
    assert "make test-second-config" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.slow
def test_second_configuration_changes_the_digits_of_a_training_run():
    threads, capability, loss = _train({})
    threads_2, capability_2, loss_2 = _train(SECOND_CONFIG)
    assert (threads_2, capability_2) == ("1", "DEFAULT")
    assert loss != loss_2, (f"the same loss {loss} in both configurations ({threads} threads {capability} vs "
                            "1 thread DEFAULT): the second nbval run would prove nothing")
