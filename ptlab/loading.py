"""Old path of chapter 3's loading helpers, kept for notebooks and code written against it.

The worker helpers are in ptlab.workers, the chapter's datasets and process probes in ptlab/lessons/ch03_data.
"""
from ptlab.data import normalize_uint8 as normalize_batch  # noqa: F401
from ptlab.lessons.ch03_data.datasets import *  # noqa: F401,F403
from ptlab.lessons.ch03_data.processes import *  # noqa: F401,F403
from ptlab.workers import *  # noqa: F401,F403
