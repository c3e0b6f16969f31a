"""The pitfall contract: every registered pitfall shows its symptom buggy and not fixed."""
import pytest

from ptlab.pitfalls import Outcome, all_pitfalls, get_pitfall, pitfall

PITFALLS = all_pitfalls()


def test_registry_is_not_empty_and_covers_chapter_1():
    assert len(all_pitfalls(chapter=1)) >= 4


@pytest.mark.parametrize("record", PITFALLS, ids=[p.id for p in PITFALLS])
def test_buggy_run_is_broken(record):
    outcome = record.run(buggy=True)
    assert outcome.broken, f"{record.id}: the bug did not show its symptom ({record.symptom}); figures {outcome.figures}"


@pytest.mark.parametrize("record", PITFALLS, ids=[p.id for p in PITFALLS])
def test_fixed_run_is_not_broken(record):
    outcome = record.run(buggy=False)
    assert not outcome.broken, f"{record.id}: the fix still shows the symptom; figures {outcome.figures}"


@pytest.mark.parametrize("record", PITFALLS, ids=[p.id for p in PITFALLS])
def test_record_is_complete(record):
    assert record.title and record.symptom and record.why and record.catch
    markers = [m for _, m in record.marked_lines() if m]
    assert "BUG" in markers and "FIX" in markers
    assert record.source.lstrip().startswith("def "), "the widget shows the function, not the decorator"


def test_figures_are_formatted_reproducibly():
    outcome = Outcome(figures={"tiny": 1.3e-7, "pi": 3.14159265, "n": 12345, "s": "x"}, broken=False)
    assert outcome.formatted_figures() == {"tiny": "0", "pi": "3.142", "n": "12,345", "s": "x"}


def test_unknown_id_lists_known_ones():
    with pytest.raises(KeyError, match="known ids: .*uint8-overflow"):
        get_pitfall("no-such-pitfall")


def test_registration_rejects_unmarked_code():
    with pytest.raises(ValueError, match="# BUG"):
        @pitfall(id="unmarked-example", chapter=0, title="t", symptom="s", why="w", catch="c")
        def unmarked(buggy: bool) -> Outcome:
            return Outcome(figures={}, broken=buggy)


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
        Outcome(figures={}, broken=True, series={"loss": [torch.tensor(1.0)]})
