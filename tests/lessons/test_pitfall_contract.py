"""The pitfall contract: every registered pitfall shows its symptom buggy and not fixed."""
import pytest

from ptlab.course.pitfalls import Check, Outcome, all_pitfalls, get_pitfall, pitfall

PITFALLS = all_pitfalls()


def test_registry_is_not_empty_and_covers_chapter_1():
    assert len(all_pitfalls(chapter=1)) >= 4


def _skip_if_unavailable(record):
    reason = record.unavailable_reason()
    if reason is not None:
        pytest.skip(f"{record.id}: {reason}")


_RUNS: dict[tuple[str, bool], Outcome] = {}


def _run(record, buggy: bool) -> Outcome:
    """The record run once each way in this test session: the three tests below judge the same two runs."""
    if (record.id, buggy) not in _RUNS:
        _RUNS[record.id, buggy] = record.run(buggy=buggy)
    return _RUNS[record.id, buggy]


@pytest.mark.parametrize("record", PITFALLS, ids=[p.id for p in PITFALLS])
def test_buggy_run_shows_every_check(record):
    _skip_if_unavailable(record)
    outcome = _run(record, buggy=True)
    failed = [c.line() for c in outcome.checks if not c.holds]
    assert outcome.broken and not failed, f"{record.id}: with the bug on these checks fail: {failed}"


@pytest.mark.parametrize("record", PITFALLS, ids=[p.id for p in PITFALLS])
def test_fixed_run_shows_no_check(record):
    _skip_if_unavailable(record)
    outcome = _run(record, buggy=False)
    held = [c.line() for c in outcome.checks if c.holds]
    assert not outcome.broken and not held, f"{record.id}: fixed, these symptom checks still hold: {held}"


@pytest.mark.parametrize("record", PITFALLS, ids=[p.id for p in PITFALLS])
def test_both_runs_check_the_same_statements(record):
    """The fixed run is judged by the very checks that showed the bug."""
    _skip_if_unavailable(record)
    buggy, fixed = _run(record, buggy=True), _run(record, buggy=False)
    assert [(c.what, c.bound) for c in buggy.checks] == [(c.what, c.bound) for c in fixed.checks]


@pytest.mark.parametrize("record", PITFALLS, ids=[p.id for p in PITFALLS])
def test_record_is_complete(record):
    assert record.title and record.symptom and record.why and record.catch
    markers = [m for _, m in record.marked_lines() if m]
    assert "BUG" in markers and "FIX" in markers
    assert record.source.lstrip().startswith("def "), "the widget shows the function, not the decorator"


def test_figures_follow_the_one_display_rule():
    outcome = Outcome(figures={"tiny": 1.3e-7, "pi": 3.14159265, "n": 12345, "s": "x", "big": 123456.7},
                      checks=[Check("pi", 3.14159265, "> 3")])
    assert outcome.formatted_figures() == {"tiny": "≈1.3e-07", "pi": "≈3.142", "n": "12,345", "s": "x",
                                           "big": "≈123,457"}
    assert outcome.broken and outcome.checks[0].line() == "pi: ≈3.142 > 3"


def test_outcome_needs_checks():
    with pytest.raises(TypeError, match="checks"):
        Outcome(figures={}, checks=[])


def test_unknown_id_lists_known_ones():
    with pytest.raises(KeyError, match="known ids: .*uint8-overflow"):
        get_pitfall("no-such-pitfall")


def test_registration_rejects_unmarked_code():
    with pytest.raises(ValueError, match="# BUG"):
        @pitfall(id="unmarked-example", chapter=0, title="t", symptom="s", why="w", catch="c")
        def unmarked(buggy: bool) -> Outcome:
            return Outcome(figures={}, checks=[Check("bug", buggy, "is True")])


def test_registration_rejects_bad_id_and_signature():
    with pytest.raises(ValueError, match="lowercase"):
        pitfall(id="Bad Id", chapter=0, title="t", symptom="s", why="w", catch="c")(lambda buggy: None)
    with pytest.raises(TypeError, match="buggy"):
        @pitfall(id="no-buggy-arg", chapter=0, title="t", symptom="s", why="w", catch="c")
        def wrong(flag):
            x = 1  # BUG
            return x  # FIX


def test_outcome_rejects_tensor_series():
    import torch

    with pytest.raises(TypeError, match="plain numbers"):
        Outcome(figures={}, checks=[Check("x", 1, "> 0")], series={"loss": [torch.tensor(1.0)]})


def test_running_a_pitfall_leaves_the_callers_random_state_alone():
    import random

    import numpy as np
    import torch

    def draws():
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    expected = draws()
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    for record in all_pitfalls(chapter=1):
        record.run(buggy=True)
    assert draws() == expected


def _sleeping_record(in_subprocesses: bool):
    import time

    from ptlab.course.pitfall_record import Pitfall

    spans = []

    def reproduce(buggy: bool) -> Outcome:
        start = time.perf_counter()
        time.sleep(0.4)                      # stands in for waiting on a child process
        spans.append((start, time.perf_counter()))
        return Outcome(figures={}, checks=[Check("bug", buggy, "is True")])

    return Pitfall("sleeper", 0, "t", "s", "w", "c", reproduce, in_subprocesses), spans


@pytest.mark.parametrize("in_subprocesses", [True, False])
def test_compare_runs_both_ways_at_once_only_for_subprocess_reproductions(monkeypatch, in_subprocesses):
    from ptlab.course import pitfalls as registry

    record, spans = _sleeping_record(in_subprocesses)
    monkeypatch.setattr(registry, "get_pitfall", lambda _id: record)
    comparison = registry.compare_pitfall("sleeper")
    assert comparison.buggy.broken and not comparison.fixed.broken        # buggy first, fixed second, either way
    (a_start, a_end), (b_start, b_end) = sorted(spans)
    overlapped = b_start < a_end
    assert overlapped == in_subprocesses


def test_a_pitfall_that_cannot_run_here_says_why_everywhere(monkeypatch, capsys):
    """The record's `unavailable` hook: run() raises PitfallUnavailable; compare_pitfall, the command line and the
    widget print the one skip line (Pitfall.skipped_text) and claim nothing; the reproduction is never called."""
    from ptlab.__main__ import main
    from ptlab.course import pitfalls as registry
    from ptlab.course.pitfall_record import Pitfall, PitfallUnavailable
    from ptlab.course.widgets import PitfallWidget

    def reproduce(buggy: bool) -> Outcome:
        pytest.fail("the reproduction ran")

    record = Pitfall("needs-linux", 3, "t", "s", "w", "c", reproduce,
                     unavailable=lambda: "needs Linux; this is darwin")
    assert record.unavailable_reason() == "needs Linux; this is darwin"
    skipped = "skipped: needs Linux; this is darwin"
    assert record.skipped_text() == skipped
    with pytest.raises(PitfallUnavailable, match="pitfall 'needs-linux' cannot run here: needs Linux; this is darwin"):
        record.run(buggy=True)
    monkeypatch.setattr(registry, "get_pitfall", lambda _id: record)
    assert registry.compare_pitfall("needs-linux") is None
    assert capsys.readouterr().out == f"needs-linux\n{skipped}\n"
    assert main(["pitfalls", "run", "needs-linux"]) == 0
    out = capsys.readouterr().out     # what the widget teaches (code, why, catch), then the skip line instead of a run
    assert out.startswith("t  [needs-linux, chapter 3]\n") and out.endswith(f"\n\n{skipped}\n") and "Run (" not in out
    widget = PitfallWidget(record)
    widget.run()          # outside a kernel the output area's print reaches stdout (after clear_output's "\r")
    assert capsys.readouterr().out.split("\r")[-1] == f"{skipped}\n" and widget.last_outcome is None


def _two_ways(fixed_still_shows: bool = False):
    from ptlab.course.pitfall_record import Pitfall

    def reproduce(buggy: bool) -> Outcome:
        n = 3 if buggy or fixed_still_shows else 0
        return Outcome(figures={"loss": 0.5 if buggy else 0.25, "dtype": "torch.uint8", "n": n},
                       checks=[Check("n", n, "> 1")])

    return Pitfall("two-ways", 1, "t", "s", "w", "c", reproduce)


# compare_pitfall's format, which every notebook's stored output holds (strict nbval compares it)
TWO_WAYS = """\
two-ways
         bug on        fixed
  loss   ≈0.5          ≈0.25
  dtype  torch.uint8   torch.uint8
  n      3             0
✔ bug on: n: 3 > 1
✔ fixed: n: 0, not > 1
"""


def test_every_view_shows_a_run_in_compare_pitfalls_one_text(monkeypatch, capsys):
    """compare_pitfall, `python -m ptlab pitfalls run` and the widget all show a run as run_text makes it."""
    import html

    from ptlab.__main__ import main
    from ptlab.course import pitfalls as registry
    from ptlab.course.pitfall_record import run_text
    from ptlab.course.widgets import figures_html

    record = _two_ways()
    monkeypatch.setattr(registry, "get_pitfall", lambda _id: record)
    registry.compare_pitfall("two-ways")
    assert capsys.readouterr().out == TWO_WAYS
    for label, flags in (("bug on", []), ("fixed", ["--fixed"])):
        assert main(["pitfalls", "run", "two-ways", *flags]) == 0
        one_run = run_text({label: record.run(buggy=label == "bug on")})
        lesson, run = capsys.readouterr().out.split("\nRun (", 1)  # the lesson, then the run
        assert lesson.startswith("t  [two-ways, chapter 1]\n") and run.split("\n", 1)[1] == f"{one_run}\n"
        assert f">{html.escape(one_run)}</pre>" in figures_html(label, record.run(buggy=label == "bug on"))
    assert one_run.splitlines()[0] == "         fixed" and one_run.splitlines()[-1] == "✔ fixed: n: 0, not > 1"


def test_a_fixed_run_that_still_shows_a_check_is_marked_and_fails_compare_pitfall(monkeypatch, capsys):
    from ptlab.claims import ClaimFailed
    from ptlab.course import pitfalls as registry

    monkeypatch.setattr(registry, "get_pitfall", lambda _id: _two_ways(fixed_still_shows=True))
    with pytest.raises(ClaimFailed, match="claim does not hold on this machine: fixed: n: 3 > 1"):
        registry.compare_pitfall("two-ways")
    assert capsys.readouterr().out.splitlines()[-2:] == ["✔ bug on: n: 3 > 1", "✘ fixed: n: 3 > 1"]


def test_every_pitfall_runs_on_this_course_machine_kind():
    """Linux with 2 cores or more (CI, the course's machines): no pitfall may skip itself here."""
    import os
    import sys

    if sys.platform != "linux" or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("not a course machine")
    assert [p.id for p in PITFALLS if p.unavailable_reason() is not None] == []
