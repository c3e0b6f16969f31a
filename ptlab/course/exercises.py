"""Auto-checked exercises: a learner edits a cell, `check(id, answer)` answers it.

A stub is left as `...` (Ellipsis), or a function whose body is `...`; the check then says
"not attempted yet". A wrong answer gets a hint; a right one a confirmation.
"""
from __future__ import annotations

import dis
import hashlib
from dataclasses import dataclass
from typing import Any, Callable

from ptlab.course.topics import import_lesson_modules, refuse_second_id

__all__ = ["Exercise", "exercise", "check", "all_exercises", "NotAttempted", "Wrong"]

_REGISTRY: dict[str, "Exercise"] = {}

NOT_ATTEMPTED, WRONG, CORRECT = "not attempted", "wrong", "correct"  # the Verdict values


class Verdict(str):
    """'correct', 'wrong' or 'not attempted'; already printed, so a notebook shows it only once."""

    def _ipython_display_(self) -> None:
        # check() printed the verdict; without this the cell would echo it as a result as well.
        pass


class NotAttempted(Exception):
    """Raised by a checker when the answer is still the stub."""


class Wrong(Exception):
    """Raised by a checker with what is wrong with this answer; `hint=` replaces the exercise's own hint
    where this mistake needs another one."""

    def __init__(self, message: str = "", hint: str | None = None):
        super().__init__(message)
        self.hint = hint


@dataclass(frozen=True)
class Exercise:
    """An exercise: the task in one line, a hint, and a checker that raises Wrong or NotAttempted."""

    id: str
    chapter: int
    task: str
    hint: str
    checker: Callable[[Any], None]


def exercise(*, id: str, chapter: int, task: str, hint: str):
    """Register `checker(answer)`: return on success, raise Wrong(hint) or NotAttempted otherwise."""

    def register(checker: Callable[[Any], None]) -> Callable[[Any], None]:
        refuse_second_id(_REGISTRY, "exercise", id, checker, lambda e: e.checker)
        _REGISTRY[id] = Exercise(id, chapter, task, hint, checker)
        return checker

    return register


def _load_topics() -> None:
    import_lesson_modules("exercises")


def all_exercises(chapter: int | None = None) -> list[Exercise]:
    """Every registered exercise (or one chapter's)."""
    _load_topics()
    return [e for e in _REGISTRY.values() if chapter is None or e.chapter == chapter]


def check(exercise_id: str, answer: Any) -> "Verdict":
    """Check a learner's answer, print one line, and return 'correct', 'wrong' or 'not attempted'."""
    _load_topics()
    if exercise_id not in _REGISTRY:
        raise KeyError(f"no exercise {exercise_id!r}; known: {', '.join(sorted(_REGISTRY))}")
    ex = _REGISTRY[exercise_id]
    try:
        if is_untouched_stub(answer):
            raise NotAttempted
        ex.checker(answer)
    except NotAttempted:
        print(f"○ {ex.id}: not attempted yet. Task: {ex.task}")
        return Verdict(NOT_ATTEMPTED)
    except Wrong as wrong:
        detail = f" {wrong}" if str(wrong) else ""
        print(f"✘ {ex.id}: not yet.{detail} Hint: {wrong.hint or ex.hint}")
        return Verdict(WRONG)
    except Exception as err:
        if raised_in_learner_code(err):
            print(f"✘ {ex.id}: your answer raised {type(err).__name__}: {err}. Hint: {ex.hint}")
        else:  # only ptlab's checker and libraries ran: the answer's type, or a bug in the checker
            print(f"✘ {ex.id}: the checker could not use your answer: {type(err).__name__}: {err}. "
                  f"Task: {ex.task}. (If your answer fits the task, this is a bug in the checker: please report it.)")
        return Verdict(WRONG)
    print(f"✔ {ex.id}: correct.")
    return Verdict(CORRECT)


def raised_in_learner_code(err: BaseException) -> bool:
    """True when a frame of the traceback is the learner's code (a notebook cell or their own module),
    not ptlab's checker, the standard library or an installed package."""
    import os
    import sys
    import sysconfig

    ptlab_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    library_dirs = {os.path.abspath(p) for p in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"],
                                                 sysconfig.get_paths()["platlib"], sys.prefix, sys.base_prefix)}
    tb = err.__traceback__
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        ours = filename.startswith(ptlab_dir + os.sep)
        library = any(filename.startswith(d + os.sep) for d in library_dirs)
        if not ours and not library:
            return True
        tb = tb.tb_next
    return False


def is_untouched_stub(answer: Any) -> bool:
    """The stub as handed out: `...`, or a function whose body is only `...`, `pass` and a docstring."""
    if answer is Ellipsis:
        return True
    code = getattr(answer, "__code__", None)
    if code is None:
        return False
    ops = [(i.opname, i.argval) for i in dis.get_instructions(code) if i.opname not in ("RESUME", "NOP", "CACHE")]
    return ops in ([("LOAD_CONST", None), ("RETURN_VALUE", None)], [("RETURN_CONST", None)])


def calls_stub(fn: Callable[..., Any], *args: Any) -> Any:
    """Call a learner's function: an untouched stub (a body of only `...`, `pass` and a docstring), or one that
    returns the stub's `...`, is "not attempted"; a function with code that returns None is wrong (a `return` is
    missing)."""
    if not callable(fn):
        raise Wrong(f"expected a function, got {type(fn).__name__}")
    if is_untouched_stub(fn):
        raise NotAttempted
    result = fn(*args)
    if result is Ellipsis:
        raise NotAttempted
    if result is None:
        raise Wrong("your function returned None: is a `return` missing?")
    return result


def answer_digest(value: Any) -> str:
    """How a checker compares an answer that is a value (a name, a count) without writing the value into its
    comparison: its repr's sha256, shortened."""
    return hashlib.sha256(repr(value).encode("utf-8")).hexdigest()[:16]
