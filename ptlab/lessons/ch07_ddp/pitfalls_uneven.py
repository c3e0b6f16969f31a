"""Chapter 7 pitfall: ranks that run different numbers of steps (uneven inputs), and DDP's Join.

Read in two halves, as in pitfalls.py: under `if in_rank:` what each of the 2 ranks runs, then the harness that
starts them with ptlab.distributed.run_ranks and measures what they returned.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.distributed import run_ranks
from ptlab.lessons.ch07_ddp.rank_functions import rank_mlp

BATCHES = (4, 2)        # rank 0 has 4 batches, rank 1 has 2


def _batches(rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Rank `rank`'s own batches, BATCHES[rank] of them: (8, 8) inputs and (8,) labels."""
    g = torch.Generator().manual_seed(rank)
    return [(torch.randn(8, 8, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(BATCHES[rank])]


def replay_with_join(lr: float = 0.1) -> torch.Tensor:
    """One process replaying what Join trains: each step's gradient is the sum over the ranks that still have a
    batch, divided by the initial world size (a rank that has joined adds zeros). Returns the flat weights."""
    model = rank_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    batches = [_batches(rank) for rank in range(len(BATCHES))]
    for step in range(max(BATCHES)):
        optimizer.zero_grad()
        for rank_batches in batches:
            if step < len(rank_batches):
                X, y = rank_batches[step]
                (nn.functional.cross_entropy(model(X), y) / len(BATCHES)).backward()   # adds to .grad
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pitfall(
    id="ddp-uneven-inputs", chapter=7,
    title="Ranks with different numbers of batches: the rank with more waits in an all-reduce no other rank joins",
    symptom="rank 0 has 4 batches and rank 1 has 2: after step 2 the ranks wait in collectives that do not "
            "match until the process group's timeout (2 s here), and the job ends with gloo's timeout error",
    why="""Every backward under DDP is a collective: rank 0's third backward waits for rank 1's third all-reduce,
    which never comes, because rank 1 has run out of batches and moved on (here to the barrier at the end). Both
    wait until the timeout. Uneven counts come from an IterableDataset or a sampler that gives ranks different
    numbers of batches, a filter that drops examples, or any `break` or `continue` decided on one rank alone. With
    `Join([model])` around the loop, a rank that runs out of batches stays in the context and answers the other
    ranks' all-reduces with zeros until every rank has finished, then the last rank to finish broadcasts its
    weights, so all ranks end with the same ones. DDP's join hook divides by the initial world size
    (divide_by_initial_world_size=True, the default), so in a step where rank 1 adds zeros rank 0 steps with half
    its own gradient.""",
    catch="""Check that every rank gets the same number of batches (DistributedSampler does, padding or trimming;
    an IterableDataset or a custom sampler may not). Where counts can differ, wrap the loop in
    `with Join([model]):` (torch.distributed.algorithms.join). A decision made on one rank's numbers (stop
    early, skip a batch whose loss is not finite, a time budget) must be made together: all_reduce the flag
    (MIN or MAX) so every rank takes the same branch. Join answers only DDP's own collectives: a loop that runs
    others (a metric, that stop vote, SyncBatchNorm) aborts or hangs under Join; there pass
    `throw_on_early_termination=True` and handle the error, as DDP.join's documentation says.""",
)
def uneven_inputs(buggy: bool, in_rank: bool = False):
    if in_rank:                                            # what each of the 2 ranks runs
        model = DDP(rank_mlp())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        if buggy:
            together = contextlib.nullcontext()            # BUG: rank 0's steps 3 and 4 wait for rank 1
        else:
            together = Join([model])                       # FIX: rank 1 answers with zeros until rank 0 is done
        steps = 0
        with together:
            for X, y in _batches(dist.get_rank()):         # 4 batches on rank 0, 2 on rank 1
                loss = nn.functional.cross_entropy(model(X), y)
                optimizer.zero_grad()
                loss.backward()                            # an all-reduce of the gradients
                optimizer.step()
                steps += 1
        dist.barrier()                                     # the end of the epoch: save, evaluate, ...
        return {"steps": steps, "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}
    # The harness: 2 ranks run the code above with a 2 s collective timeout; how did the job end?
    run = run_ranks(uneven_inputs, 2, collective_timeout_s=2.0, timeout_s=60.0, buggy=buggy, in_rank=True)
    timed_out = any("timed out" in e.lower() or "timeout" in e.lower() for e in run.errors.values())
    figures: dict = {"batches per rank": f"{BATCHES[0]} and {BATCHES[1]}", "a rank timed out": timed_out}
    if run.ok:
        (r0, r1), replayed = run.results, replay_with_join()
        figures.update({"steps each rank ran": f"{r0['steps']} and {r1['steps']}",
                        "the ranks end with identical weights": torch.equal(r0["weights"], r1["weights"]),
                        "largest |weight - one process's replay|": (r0["weights"] - replayed).abs().max().item()})
    return Outcome(figures=figures,
                   checks=[Check("a rank failed", bool(run.errors), "is True"),
                           Check("a rank ended with gloo's timeout error", timed_out, "is True")])
