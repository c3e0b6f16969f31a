"""Chapter 3 exercises: the worker-seeding checker under the platform's default start method."""
from ptlab.lessons.ch03_data.exercises import _start_method_for, check_worker_seeding
from ptlab.workers import seed_worker_numpy_rng


def test_the_seeding_exercise_runs_a_module_function_under_the_default_start_method():
    assert _start_method_for(seed_worker_numpy_rng) is None
    check_worker_seeding(seed_worker_numpy_rng)   # raises Wrong if the draws repeat
