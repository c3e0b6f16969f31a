"""ptlab.profiling: ranges, a trace that opens in Perfetto, and a verdict that follows the evidence."""
import json
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from ptlab.profiling import profile_training, profiled


class SlowImages(Dataset):
    """Each sample costs 20 ms of "decoding": a loader far slower than a tiny model."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        time.sleep(0.02)
        return torch.zeros(16), i % 2


def test_a_slow_loader_is_input_bound_and_a_big_model_compute_bound(tmp_path):
    torch.manual_seed(0)
    tiny = nn.Linear(16, 2)
    report = profile_training(tiny, DataLoader(SlowImages(), batch_size=16), torch.optim.SGD(tiny.parameters(), lr=0.1),
                              steps=4, trace=tmp_path / "trace.json")
    assert report.verdict.startswith("input-bound") and report.data_share > 0.6
    assert set(report.ranges_ms) == {"data", "compute"}
    events = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert any(e.get("name") == "compute" for e in events)
    assert "aten::" in report.table and "trace.json" in str(report)

    big = nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 2))
    data = TensorDataset(torch.randn(256, 512), torch.randint(0, 2, (256,)))
    report = profile_training(big, DataLoader(data, batch_size=128), torch.optim.SGD(big.parameters(), lr=0.1), steps=2)
    assert report.verdict.startswith("compute-bound") and report.data_share < 0.2


def test_profiled_block_without_ranges_gives_no_verdict():
    with profiled() as report:
        torch.randn(64, 64) @ torch.randn(64, 64)
    assert "aten::mm" in report.table and report.verdict.startswith("no verdict")


def test_bad_steps_is_named():
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="steps"):
        profile_training(model, [], torch.optim.SGD(model.parameters(), lr=1), steps=0)


def test_the_profilers_own_log_lines_do_not_reach_stderr():
    import subprocess
    import sys

    code = ("import torch\nfrom ptlab.profiling import profiled\n"
            "with profiled() as r:\n    torch.randn(8, 8) @ torch.randn(8, 8)\n"
            "import sys; print('block stderr kept', file=sys.stderr)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "profiler_start" not in result.stderr
    assert "block stderr kept" in result.stderr


@pytest.mark.parametrize("data_ms, expected", [
    (4.0, ["compute-bound", "≈4% of the step waits for data", "the loader keeps up", "at most ≈4%"]),
    (30.0, ["compute-bound", "data loading costs ≈30% of the step", "save up to ≈30%", "≈1.43x"]),
    (49.0, ["compute-bound", "data loading costs ≈49% of the step", "save up to ≈49%", "≈1.96x"]),
    (75.0, ["input-bound", "≈75% of the step waits for data", "save up to ≈75%", "≈4x"]),
])
def test_the_verdict_is_graded_by_the_measured_share_and_names_no_chapter(data_ms, expected):
    from ptlab.profiling import ProfileReport

    verdict = ProfileReport(ranges_ms={"data": data_ms, "compute": 100.0 - data_ms}).verdict
    assert verdict.startswith(expected[0]) and all(part in verdict for part in expected[1:]), verdict
    assert "will not help" not in verdict and "chapter" not in verdict.lower()


def test_tables_are_narrow_the_full_ones_are_kept_and_the_allocator_note_is_held_back(tmp_path):
    import subprocess
    import sys

    code = ("import torch\nfrom torch import nn\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "from ptlab.profiling import profile_training\n"
            "model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2))\n"
            "data = TensorDataset(torch.randn(256, 64), torch.randint(0, 2, (256,)))\n"
            "r = profile_training(model, DataLoader(data, batch_size=32), torch.optim.AdamW(model.parameters()),"
            " steps=3, trace='traces/t.json')\n"
            "print(r)\nprint('FULL', 'Self CPU %' in r.full_table, 'CPU Mem' in r.full_memory_table)\n"
            "print('WIDTH', max(len(line) for line in (r.table + '\\n' + r.peak_memory_table).splitlines()))\n")
    import os
    from pathlib import Path

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}   # this checkout's ptlab
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=env)
    assert result.returncode == 0, result.stderr
    assert "allocated before the profiling started" not in result.stderr
    assert "FULL True True" in result.stdout and "trace written to traces/t.json" in result.stdout
    width = int(result.stdout.split("WIDTH ")[1].split()[0])
    assert width <= 100 and "compute " not in result.stdout.split("named ranges")[0]
    assert (tmp_path / "traces" / "t.json").stat().st_size > 0
