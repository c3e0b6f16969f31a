"""check() itself: a learner's error and a checker's own failure are told apart."""
from ptlab.course.exercises import _REGISTRY, Exercise, calls_stub, check


def _register(ex_id, checker):
    _REGISTRY[ex_id] = Exercise(ex_id, 0, "return a number", "hint", checker)


def test_an_error_in_the_learners_code_is_theirs(capsys):
    _register("probe-calls-learner", lambda fn: calls_stub(fn, 1))

    def answer(x):
        return x / 0

    try:
        assert check("probe-calls-learner", answer) == "wrong"
    finally:
        _REGISTRY.pop("probe-calls-learner")
    out = capsys.readouterr().out
    assert "your answer raised ZeroDivisionError" in out and "bug in the checker" not in out


def test_an_error_inside_the_checker_is_not_blamed_on_the_learner(capsys):
    def buggy_checker(answer):
        return {}["missing key"]  # a checker bug: the learner's answer is never called

    buggy_checker.__code__ = buggy_checker.__code__.replace(co_filename=calls_stub.__code__.co_filename)
    _register("probe-buggy-checker", buggy_checker)
    try:
        assert check("probe-buggy-checker", 42) == "wrong"
    finally:
        _REGISTRY.pop("probe-buggy-checker")
    out = capsys.readouterr().out
    assert "your answer raised" not in out
    assert "the checker could not use your answer: KeyError" in out and "bug in the checker" in out


def test_an_untouched_stub_function_is_not_attempted_and_a_missing_return_is_wrong(capsys):
    from ptlab.course.exercises import is_untouched_stub

    def stub(v):
        """Return the rows normalised."""
        ...

    def passes(v):
        pass

    def forgot_return(v):
        v = v / v.sum()

    assert is_untouched_stub(...) and is_untouched_stub(stub) and is_untouched_stub(passes)
    assert not is_untouched_stub(forgot_return) and not is_untouched_stub(lambda v: 0) and not is_untouched_stub(42)
    _register("probe-stub", lambda fn: calls_stub(fn, 1.0))
    try:
        assert check("probe-stub", stub) == "not attempted"
        assert "not attempted yet" in capsys.readouterr().out
        assert check("probe-stub", forgot_return) == "wrong"
    finally:
        _REGISTRY.pop("probe-stub")


def test_a_wrong_answer_gets_the_hint_of_its_own_mistake(capsys):
    from ptlab.course.exercises import Wrong

    def checker(answer):
        if answer == 1:
            raise Wrong("one is not it.")
        raise Wrong("two is not it either.", hint="count again")

    _register("probe-own-hint", checker)
    try:
        assert check("probe-own-hint", 1) == "wrong"
        assert capsys.readouterr().out.strip() == "✘ probe-own-hint: not yet. one is not it. Hint: hint"
        assert check("probe-own-hint", 2) == "wrong"
        assert capsys.readouterr().out.strip() == "✘ probe-own-hint: not yet. two is not it either. Hint: count again"
    finally:
        _REGISTRY.pop("probe-own-hint")
