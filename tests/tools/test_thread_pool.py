"""ptlab.thread_pool: step times in a fresh process per thread count and wait policy, quiet and beside a busy
process."""
import os
import time

import psutil
import pytest

import ptlab.thread_pool as thread_pool
from ptlab.thread_pool import (StepTimes, available_cores, start_busy_process, step_times, stop_busy_process,
                               thread_pool_comparison, thread_report)


def test_available_cores_is_a_positive_count_within_the_machine():
    assert 1 <= available_cores() <= (os.cpu_count() or 1)


def test_the_busy_process_spins_until_it_is_stopped():
    proc = start_busy_process(seconds=60)
    try:
        child = psutil.Process(proc.pid)
        before = sum(child.cpu_times()[:2])
        time.sleep(1.0)
        assert sum(child.cpu_times()[:2]) - before > 0.1      # it burns CPU (more than 10% of a core)
        assert proc.poll() is None
    finally:
        stop_busy_process(proc)
    assert proc.poll() is not None


def test_the_busy_process_stops_by_itself_after_its_seconds():
    proc = start_busy_process(seconds=0.2)
    try:
        assert proc.wait(timeout=30) == 0
    finally:
        stop_busy_process(proc)


def test_step_times_runs_in_a_fresh_process_with_the_asked_threads_and_wait_policy(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")       # the parent's policy must not leak into "unset"
    calls = []
    real_run = thread_pool.subprocess.run

    def spy(cmd, **kwargs):
        calls.append(kwargs["env"].get("OMP_WAIT_POLICY"))
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(thread_pool.subprocess, "run", spy)
    run = step_times(1, None, rounds=1, steps=2, batch_size=4, width=2, warmup=0)
    passive = step_times(1, "PASSIVE", loads=("busy",), rounds=2, steps=1, batch_size=4, width=2, warmup=0)
    assert calls == [None, "PASSIVE"]
    assert (run.threads, run.wait_policy, passive.wait_policy) == (1, None, "PASSIVE")
    assert {k: len(v) for k, v in run.times.items()} == {"quiet": 2, "busy": 2}
    assert {k: len(v) for k, v in passive.times.items()} == {"busy": 2}   # 2 rounds of 1 step
    assert all(t > 0 for v in run.times.values() for t in v)
    assert run.busy_over_quiet == run.median("busy") / run.median("quiet")
    assert run.name == "1 thread, OMP_WAIT_POLICY=unset"


@pytest.mark.parametrize("kwargs", [
    {"threads": 0}, {"threads": True}, {"threads": 1.5}, {"wait_policy": "passive"}, {"loads": ()},
    {"loads": ("idle",)}, {"loads": ("busy", "busy")}, {"rounds": 0}, {"steps": 0}, {"batch_size": 1},
    {"width": 0}, {"warmup": -1},
])
def test_step_times_rejects_bad_arguments_before_starting_anything(kwargs, monkeypatch):
    monkeypatch.setattr(thread_pool.subprocess, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError):
        step_times(**{"threads": 1, **kwargs})


def test_a_failing_child_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(thread_pool, "__name__", "ptlab.no_such_module")   # the child cannot import its entry point
    with pytest.raises(RuntimeError, match="(?s)the measuring process failed .*no_such_module"):
        step_times(1, rounds=1, steps=1, batch_size=2, width=1, warmup=0)


def test_the_child_imports_this_ptlab_even_from_a_folder_that_holds_another(tmp_path, monkeypatch):
    (tmp_path / "ptlab").mkdir()
    (tmp_path / "ptlab" / "__init__.py").write_text("raise ImportError('the wrong ptlab')\n")
    monkeypatch.chdir(tmp_path)
    run = step_times(1, loads=("quiet",), rounds=1, steps=1, batch_size=2, width=1, warmup=0)
    assert len(run.times["quiet"]) == 1


def test_step_times_median_rejects_a_load_it_did_not_measure():
    run = StepTimes(1, None, {"quiet": [0.1, 0.3, 0.2]})
    assert run.median("quiet") == 0.2
    with pytest.raises(ValueError, match="load must be one of quiet"):
        run.median("busy")


def test_comparison_rejects_empty_lists():
    with pytest.raises(ValueError, match="must not be empty"):
        thread_pool_comparison(threads=[])


def _fake(threads, policy, quiet, busy):
    return StepTimes(threads, policy, {"quiet": [quiet], "busy": [busy]})


def test_thread_report_has_one_row_per_configuration_and_the_wait_policy_ratios(monkeypatch):
    results = [_fake(1, None, 0.060, 0.065), _fake(1, "PASSIVE", 0.060, 0.066),
               _fake(2, None, 0.040, 0.600), _fake(2, "PASSIVE", 0.042, 0.090)]
    monkeypatch.setattr(thread_pool, "thread_pool_comparison", lambda **kwargs: results)
    pinned = {None: {1: [0.04], 2: [0.52]}, "PASSIVE": {1: [0.04], 2: [0.05]}}
    monkeypatch.setattr(thread_pool, "one_core_step_times", lambda policy, last_core, **kw:
                        thread_pool.OneCoreTimes(policy, int(last_core), pinned[policy]))
    lines = thread_report()
    assert lines[0].startswith("Torch's thread pool (chapter 3): SmallCNN training step, batch 32, median ms")
    rows = lines[2:6]
    assert rows[2].split()[:5] == ["2", "threads,", "OMP_WAIT_POLICY=unset", "40.0", "600.0"]
    assert "15.00x" in rows[2]                                  # busy / quiet
    assert lines[6:] == ["quiet: OMP_WAIT_POLICY unset / PASSIVE on 2 threads: 0.95x",
                         "busy: OMP_WAIT_POLICY unset / PASSIVE on 2 threads: 6.67x",
                         "a core lost (chapter 3's pitfall): step on 2 threads / on 1, one core: "
                         "OMP_WAIT_POLICY unset 13.00x, PASSIVE 1.25x"]


def test_thread_report_says_why_it_was_skipped(monkeypatch):
    def broken(**kwargs):
        raise RuntimeError("no torch here")

    monkeypatch.setattr(thread_pool, "thread_pool_comparison", broken)
    monkeypatch.setattr(thread_pool, "one_core_pinning_unavailable", lambda: "pinning needs Linux; this is darwin")
    assert thread_report() == ["thread-pool step times skipped: RuntimeError: no torch here",
                               "a core lost (chapter 3's pitfall): step on 2 threads / on 1, one core: skipped: "
                               "RuntimeError: pinning needs Linux; this is darwin"]


linux_with_two_cores = pytest.mark.skipif(thread_pool.one_core_pinning_unavailable() is not None,
                                          reason=str(thread_pool.one_core_pinning_unavailable()))


@linux_with_two_cores
def test_one_core_step_times_pins_a_fresh_process_to_one_core_and_times_1_then_2_threads(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")      # "unset" must drop the parent's policy...
    monkeypatch.setenv("GOMP_SPINCOUNT", "0")             # ...and libgomp's own spin setting
    envs = []
    real_run = thread_pool.subprocess.run

    def spy(cmd, **kwargs):
        envs.append(kwargs["env"])
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(thread_pool.subprocess, "run", spy)
    cores = sorted(os.sched_getaffinity(0))
    first = thread_pool.one_core_step_times(None, steps=2, batch_size=4, width=2)
    last = thread_pool.one_core_step_times("PASSIVE", last_core=True, steps=1, batch_size=4, width=2)
    assert [e.get("OMP_WAIT_POLICY") for e in envs] == [None, "PASSIVE"]
    assert "GOMP_SPINCOUNT" not in envs[0] and "GOMP_SPINCOUNT" not in envs[1]
    assert (first.core, last.core) == (cores[0], cores[-1])
    # The child ran every OS thread on that core alone (one_core_step_times raises otherwise) and was pinned
    # after torch started on every core; the 2-thread steps started one more OS thread (OpenMP's worker) than
    # the 1-thread steps had (numpy's own threads are there in both).
    assert first.cores_at_start == last.cores_at_start == len(cores)
    assert first.os_threads[2] == first.os_threads[1] + 1 and last.os_threads[2] == last.os_threads[1] + 1
    assert {k: len(v) for k, v in first.times.items()} == {1: 2, 2: 2}
    assert {k: len(v) for k, v in last.times.items()} == {1: 1, 2: 1}
    assert first.two_over_one == first.median(2) / first.median(1)
    assert sorted(os.sched_getaffinity(0)) == cores       # this process was not pinned


def test_one_core_step_times_says_why_it_cannot_run(monkeypatch):
    monkeypatch.delattr(thread_pool.os, "sched_setaffinity", raising=False)   # as on macOS and Windows
    monkeypatch.setattr(thread_pool.subprocess, "run", lambda *a, **k: pytest.fail("a process was started"))
    reason = thread_pool.one_core_pinning_unavailable()
    assert reason.startswith("pinning a running process to one core needs Linux")
    with pytest.raises(RuntimeError, match="needs Linux"):
        thread_pool.one_core_step_times()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="Linux only")
def test_one_core_step_times_needs_two_cores(monkeypatch):
    monkeypatch.setattr(thread_pool.os, "sched_getaffinity", lambda pid: {0})
    assert thread_pool.one_core_pinning_unavailable() == "this process may use 1 core; taking one away needs at least 2"


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"batch_size": 1}, {"width": 0}, {"wait_policy": "sleep"}])
def test_one_core_step_times_rejects_bad_arguments_before_starting_anything(kwargs, monkeypatch):
    monkeypatch.setattr(thread_pool.subprocess, "run", lambda *a, **k: pytest.fail("a process was started"))
    with pytest.raises(ValueError):
        thread_pool.one_core_step_times(**kwargs)


def test_one_core_times_median_rejects_a_thread_count_it_did_not_measure():
    run = thread_pool.OneCoreTimes(None, 0, {1: [0.04, 0.05, 0.03], 2: [0.5, 0.6, 0.4]})
    assert (run.median(1), run.median(2)) == (0.04, 0.5)
    assert run.two_over_one == 0.5 / 0.04
    with pytest.raises(ValueError, match=r"threads must be one of \[1, 2\]"):
        run.median(4)


@linux_with_two_cores
@pytest.mark.parametrize("change, message", [
    ({"thread_masks": [[0], [0, 1]]}, "not on core 0 alone"),                  # a thread escaped the pin
    ({"pool_sizes": {"1": 1, "2": 1}}, "not 1 then 2 threads"),               # the pool never grew to 2
    ({"cores_at_start": 1}, "not 1 then 2 threads on 2 cores or more"),       # pinned before torch started
])
def test_one_core_step_times_refuses_a_child_that_did_not_measure_the_pitfall(change, message, monkeypatch):
    good = {"times": {"1": [0.04], "2": [0.5]}, "pool_sizes": {"1": 1, "2": 2}, "os_threads": {"1": 1, "2": 2},
            "cores_at_start": 2, "thread_masks": [[0], [0]]}
    monkeypatch.setattr(thread_pool.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(thread_pool, "_run_child", lambda spec, policy, timeout: {**good, **change})
    with pytest.raises(RuntimeError, match=message):
        thread_pool.one_core_step_times()
    monkeypatch.setattr(thread_pool, "_run_child", lambda spec, policy, timeout: good)
    assert thread_pool.one_core_step_times().two_over_one == 0.5 / 0.04


def test_the_thread_pitfall_record_carries_its_unavailable_hook():
    """Without it, macOS and Windows learners would get a traceback where they should read 'skipped'."""
    from ptlab.course.pitfalls import get_pitfall

    assert get_pitfall("spinning-threads-lost-core").unavailable is thread_pool.one_core_pinning_unavailable
