"""Old path of the pitfall registry and its topic modules, kept for notebooks written against it.

The registry is ptlab.course.pitfalls; each chapter's pitfalls are in ptlab/lessons/chNN_*/.
"""
from ptlab._legacy import alias_submodules
from ptlab.course.pitfalls import *  # noqa: F401,F403
from ptlab.course.pitfalls import __all__  # noqa: F401

__path__: list[str] = []  # a package: `import ptlab.pitfalls.autograd` finds the aliases below
alias_submodules(__name__, {
    "registry": "ptlab.course.pitfall_record",
    "tensors": "ptlab.lessons.ch01_tensors.pitfalls",
    "autograd": "ptlab.lessons.ch02_autograd.pitfalls",
    "data_loading": "ptlab.lessons.ch03_data.pitfalls",
    "training": "ptlab.lessons.ch04_cnn_training.pitfalls_training",
    "validation": "ptlab.lessons.ch04_cnn_training.pitfalls_validation",
    "finetuning": "ptlab.lessons.ch04_cnn_training.pitfalls_finetuning",
    "checkpoints": "ptlab.lessons.ch05_checkpoints_debugging.pitfalls_checkpoints",
    "debugging": "ptlab.lessons.ch05_checkpoints_debugging.pitfalls_debugging",
    "amp": "ptlab.lessons.ch06_amp.pitfalls",
    "ddp": "ptlab.lessons.ch07_ddp.pitfalls",
    "compile_export": "ptlab.lessons.ch08_compile_export.pitfalls",
})
