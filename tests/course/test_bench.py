"""make bench's speed tables: the tools measured on the course's SmallCNN, and the order bench prints them in."""
import math

import pytest

from ptlab.course import bench
from ptlab.course.bench import ladder_report, measure_overhead, overhead_line, speed_report


@pytest.mark.slow
def test_speed_report_prints_the_four_variants_with_peak_fractions():
    lines = speed_report(width=4).splitlines()
    assert lines[0].startswith("Mixed precision (chapter 6): SmallCNN(width=4)") and " bf16 kernels: " in lines[0]
    assert lines[1].startswith("matmul peak, GFLOP per CPU-second: float32 ") and "bfloat16" in lines[1]
    assert lines[2].split()[:2] == ["variant", "images/CPU-s"] and "of its matmul peak" in lines[2]
    assert [line[:25].strip() for line in lines[3:]] == ["float32", "float32 + channels_last", "bf16 autocast",
                                                         "bf16 + channels_last"]
    assert all(line.count("≈") == 3 for line in lines[3:])


def test_speed_report_says_why_it_was_skipped(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no bf16 kernels on this build")

    monkeypatch.setattr(bench, "speed_comparison", broken)
    assert speed_report() == "mixed-precision speed table skipped: RuntimeError: no bf16 kernels on this build"


def test_ladder_report_turns_a_failure_into_one_skipped_line(monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("no compiler")
    monkeypatch.setattr(bench, "speed_ladder", broken)
    assert ladder_report() == "speed ladder skipped: RuntimeError: no compiler"


def test_make_bench_prints_the_ladder_after_the_mixed_precision_table_and_the_thread_pool_last(monkeypatch, capsys):
    """Only the wiring: the three reports and the watch line stand in for the real ones (each tested on its own)."""
    monkeypatch.setattr(bench, "notebook_paths", lambda paths: [])
    monkeypatch.setattr(bench, "speed_report", lambda: "MIXED PRECISION TABLE")
    monkeypatch.setattr(bench, "ladder_report", lambda: "SPEED LADDER TABLE")
    monkeypatch.setattr(bench, "overhead_line", lambda: ("watch overhead line", True))
    monkeypatch.setattr(bench, "thread_report", lambda: ["THREAD POOL TABLE"])
    assert bench.bench([], speed=True) == 0
    out = capsys.readouterr().out
    assert (out.index("MIXED PRECISION TABLE") < out.index("SPEED LADDER TABLE") < out.index("watch overhead line")
            < out.index("THREAD POOL TABLE"))


def test_overhead_line_says_whether_it_is_within_budget(monkeypatch):
    monkeypatch.setattr(bench, "measure_overhead",
                        lambda: {"plain s/step": 0.010, "watched s/step": 0.012, "overhead": 0.2})
    assert overhead_line() == ("ptlab watch on a SmallCNN training step (batch 64): 10.0 ms plain, "
                               "12.0 ms watched, overhead +20% (budget 25%)", True)
    monkeypatch.setattr(bench, "measure_overhead",
                        lambda: {"plain s/step": 0.010, "watched s/step": 0.013, "overhead": 0.3})
    assert overhead_line()[1] is False


def test_overhead_on_the_chapter_4_step():
    figures = measure_overhead(steps=10, repeats=3)
    print(f"watch overhead on a SmallCNN training step: {figures['overhead']:.1%}")
    assert math.isfinite(figures["overhead"])
    assert figures["overhead"] < 1.0                            # generous here; make bench prints the figure
