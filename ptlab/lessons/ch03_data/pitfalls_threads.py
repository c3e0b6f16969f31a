"""Chapter 3 pitfall: OpenMP threads spin while they wait, so a pool that loses a core after starting crawls."""
from __future__ import annotations

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.thread_pool import one_core_pinning_unavailable, one_core_step_times


@pitfall(
    id="spinning-threads-lost-core", chapter=3,
    title="Torch's threads spin while they wait: two of them on one core make every parallel op wait for the scheduler",
    symptom="in a process pinned to one core after torch started (Linux), a SmallCNN training step on 2 torch threads "
            "takes more than 2x as long as on 1 thread with OMP_WAIT_POLICY unset; with PASSIVE it does not",
    why="""torch splits a large op over its thread pool, sized when it starts to the cores it may use, and the op
    ends when every thread has finished its share. Under OpenMP's default wait policy a thread that is done
    first spins on its core before it sleeps (GNU libgomp, which torch's Linux wheel bundles: up to 300,000
    polls, or 100 when it counted fewer cores than threads at start). When two of the pool's threads share one
    core after torch started, because another program keeps the other core busy or the process lost a core,
    the thread that is done spins on the core the other one needs until the scheduler preempts it or its spin
    runs out, at every op torch splits across its threads. The reproduction makes the lost core repeatable, the
    extreme of a busy machine: it pins a fresh process to one core after importing torch (Linux only). A real
    busy program slows the step by an amount that varies from run to run, because the scheduler moves the
    threads around (section 14). With OMP_WAIT_POLICY=PASSIVE a waiting thread sleeps at once and gives the
    core up.""",
    catch="""Start Python with OMP_WAIT_POLICY=PASSIVE in its environment (make lab does; OpenMP reads it
    once, when torch is imported), or give torch only the cores that are free:
    torch.set_num_threads(cores - busy). To see it on your machine: time a step with torch's default
    threads and after torch.set_num_threads(1) while your other programs run. If more threads are much
    slower, and a fresh Python started with OMP_WAIT_POLICY=PASSIVE removes most of the gap, this is it (small ops
    and shared SMT cores can make more threads slower too). ptlab.thread_pool.one_core_step_times()
    measures the pinned case, thread_report() the busy one.""",
    in_subprocesses=True,                 # a fresh Python each way, on its own core: both run at once
    unavailable=one_core_pinning_unavailable,                # Linux with 2 cores or more
)
def spinning_threads_lost_core(buggy: bool) -> Outcome:
    if buggy:
        policy = None                                        # BUG: OpenMP's default: waiting threads spin first
    else:
        policy = "PASSIVE"                                   # FIX: waiting threads sleep at once
    run = one_core_step_times(wait_policy=policy, last_core=not buggy)   # pinned after torch started
    return Outcome(
        figures={"OMP_WAIT_POLICY": policy or "unset", "step on 1 thread, one core (ms)": run.median(1) * 1e3,
                 "step on 2 threads, one core (ms)": run.median(2) * 1e3},
        checks=[Check("step time on 2 threads / on 1 thread, one core", run.two_over_one, "> 2")],
    )
