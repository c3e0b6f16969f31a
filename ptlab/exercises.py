"""Old path of the exercise registry and its topic modules, kept for notebooks written against it.

The registry is ptlab.course.exercises; each chapter's exercises are in ptlab/lessons/chNN_*/exercises.py.
"""
from ptlab._legacy import alias_submodules
from ptlab.course.exercises import *  # noqa: F401,F403
from ptlab.course.exercises import __all__, calls_stub  # noqa: F401

__path__: list[str] = []  # a package: `import ptlab.exercises.autograd` finds the aliases below
alias_submodules(__name__, {
    "tensors": "ptlab.lessons.ch01_tensors.exercises",
    "autograd": "ptlab.lessons.ch02_autograd.exercises",
    "data_loading": "ptlab.lessons.ch03_data.exercises",
    "training": "ptlab.lessons.ch04_cnn_training.exercises",
    "checkpoints": "ptlab.lessons.ch05_checkpoints_debugging.exercises",
    "amp": "ptlab.lessons.ch06_amp.exercises",
    "ddp": "ptlab.lessons.ch07_ddp.exercises",
    "compile_export": "ptlab.lessons.ch08_compile_export.exercises",
})
