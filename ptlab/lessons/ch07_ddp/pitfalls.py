"""Chapter 7 pitfalls: DistributedDataParallel in real processes, 2 ranks on gloo (the CPU).

Each reproduction is one function read in two halves. The first, under `if in_rank:`, is the lesson: what
each of the 2 ranks runs. The second is the harness: called as the registry calls it (`in_rank=False`), the
function starts 2 ranks with ptlab.distributed.run_ranks, which run the first half (`in_rank=True`), and
measures what they returned or wrote. On Linux the ranks are forked from a server that has torch imported
already, so a run takes well under a second, except the one that waits for a timeout.
"""
from __future__ import annotations

import contextlib
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.distributed import run_ranks
from ptlab.lessons.ch07_ddp.rank_functions import (WithAuxHead, counted_allreduce, paired_validation_set,
                                                    prototype_classifier, rank_mlp)


def _mlp(batchnorm: bool = False) -> nn.Sequential:
    return rank_mlp(batchnorm, hidden=16, activation=nn.ReLU)


def _batches(steps: int, batch: int = 8, rank: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A rank's own batches (this rank's if rank is None): (batch, 8) inputs and (batch,) labels, seeded by the rank."""
    g = torch.Generator().manual_seed(dist.get_rank() if rank is None else rank)
    return [(torch.randn(batch, 8, generator=g), torch.randint(0, 3, (batch,), generator=g)) for _ in range(steps)]


def _checked(run, what: str):
    if not run.ok:
        raise RuntimeError(f"{what}: the ranks failed: {run.error}")
    return run.results


@pitfall(
    id="ddp-sampler-without-set-epoch", chapter=7,
    title="DistributedSampler without set_epoch() shuffles every epoch in the same order",
    symptom="over 4 epochs rank 0 sees its 24 indices in 1 order, the same every epoch (4 orders with set_epoch)",
    why="""DistributedSampler shuffles with a generator seeded by seed + epoch, so that every rank draws the same
    permutation and takes its own slice of it. The epoch is whatever set_epoch() last set, 0 if it was never
    called: every epoch then replays epoch 0's permutation, and each rank sees the same examples in the same
    order every time. DataLoader(shuffle=True) reshuffles by itself; with a DistributedSampler you must call
    set_epoch yourself.""",
    catch="""Call sampler.set_epoch(epoch) at the start of every epoch, before iterating the loader (the
    reference script's loader wrapper does it). To check, record the first few indices of two epochs on one
    rank: they must differ.""",
)
def sampler_without_set_epoch(buggy: bool, in_rank: bool = False):
    if in_rank:                                            # what each of the 2 ranks runs
        dataset = torch.arange(48)
        sampler = DistributedSampler(dataset, shuffle=True, seed=0)      # this rank's half, shuffled
        loader = DataLoader(dataset, batch_size=8, sampler=sampler)
        orders = []
        for epoch in range(4):
            if buggy:
                pass                                       # BUG: no set_epoch(epoch): epoch 0's order again
            else:
                sampler.set_epoch(epoch)                   # FIX: a new permutation every epoch
            orders.append([i for batch in loader for i in batch.tolist()])
        return orders
    # The harness: start 2 ranks that run the code above, then compare rank 0's epochs.
    orders = _checked(run_ranks(sampler_without_set_epoch, 2, buggy=buggy, in_rank=True), "sampler")[0]
    repeats = sum(order == orders[0] for order in orders[1:])
    distinct = len({tuple(order) for order in orders})
    return Outcome(
        figures={"rank 0, epoch 0 starts": str(orders[0][:5]), "rank 0, epoch 1 starts": str(orders[1][:5]),
                 "distinct orders in 4 epochs": distinct, "epochs repeating epoch 0": repeats},
        checks=[Check("epochs (of 3 after the first) repeating epoch 0's order", repeats, "== 3"),
                Check("distinct orders rank 0 saw in 4 epochs", distinct, "== 1")])


@pitfall(
    id="ddp-saved-wrapper-state-dict", chapter=7,
    title="Saving the DDP wrapper's state_dict(): every key gets a 'module.' prefix a plain model cannot load",
    symptom="all 4 saved keys start with 'module.', and load_state_dict on the plain model raises "
            "RuntimeError listing them as unexpected keys",
    why="""DistributedDataParallel holds your model as its attribute `module`, so the wrapper's state_dict()
    names every entry 'module.0.weight' where the model itself says '0.weight'. Such a file loads as it is only
    into a model wrapped the same way (DDP, DataParallel: anything that keeps it as `.module`); the model you
    evaluate, export or fine-tune later is a plain one, and load_state_dict refuses it (strict=True), or with
    strict=False loads nothing at all (chapter 5's pitfall ddp-prefix-strict-false).""",
    catch="""Save model.module.state_dict() (ptlab.checkpoint.save_checkpoint unwraps DDP for you), on rank 0
    only. For old files, torch.nn.modules.utils.consume_prefix_in_state_dict_if_present(state, 'module.')
    strips the prefix. Keep strict=True so a mismatch raises instead of loading nothing.""",
)
def saved_wrapper_state_dict(buggy: bool, in_rank: bool = False, folder: str = ""):
    if in_rank:                                            # what each of the 2 ranks runs
        model = DDP(_mlp())
        X, y = _batches(1)[0]
        nn.functional.cross_entropy(model(X), y).backward()
        if dist.get_rank() == 0:                           # one writer
            if buggy:
                torch.save(model.state_dict(), Path(folder, "model.pt"))          # BUG: the wrapper's keys
            else:
                torch.save(model.module.state_dict(), Path(folder, "model.pt"))   # FIX: the model's own keys
        dist.barrier()                                     # the file is complete before anyone reads it
        return
    # The harness: 2 ranks run the code above, then a plain model loads the file, as evaluation would.
    with tempfile.TemporaryDirectory() as folder:
        _checked(run_ranks(saved_wrapper_state_dict, 2, buggy=buggy, in_rank=True, folder=folder), "save")
        state = torch.load(Path(folder, "model.pt"), weights_only=True)
    try:
        _mlp().load_state_dict(state)
        error = "none"
    except RuntimeError as err:  # '...Unexpected key(s) in state_dict: "module.0.weight", ...'
        error = next(line for line in str(err).splitlines() if "Unexpected" in line).strip().split(",")[0] + ", ..."
    prefixed = sum(key.startswith("module.") for key in state)
    return Outcome(
        figures={"first saved key": next(iter(state)), "keys starting with 'module.'": f"{prefixed} of {len(state)}",
                 "load into the plain model": error},
        checks=[Check("saved keys starting with 'module.' (of 4)", prefixed, "== 4"),
                Check("load_state_dict into the plain model", error, "contains 'Unexpected key(s)'")])


@pitfall(
    id="ddp-every-rank-writes-the-log", chapter=7,
    title="Every rank appends to the same log file: each epoch is logged twice, with two different losses",
    symptom="3 epochs of 2 ranks leave 6 lines in train.log, and all 3 epochs appear twice with different losses",
    why="""All ranks run the same script, so a line that writes a file runs once per rank. Appending, the lines
    of the ranks interleave in whatever order the processes happen to run; each rank logs its own loss on its
    own shard, so the file holds two different numbers for the same epoch and a reader cannot tell which is
    which. Opened with "w" or written with torch.save, the ranks write over each other's file instead.""",
    catch="""Guard every write (logs, checkpoints, plots, the experiment log) with `if rank == 0:`, and progress
    bars with disable=rank != 0. If the logged number should describe the whole batch, all_reduce it first
    (every rank must take part), then let rank 0 write it.""",
)
def every_rank_writes_the_log(buggy: bool, in_rank: bool = False, folder: str = ""):
    if in_rank:                                            # what each of the 2 ranks runs
        model = DDP(_mlp())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for epoch, (X, y) in enumerate(_batches(3), start=1):
            loss = nn.functional.cross_entropy(model(X), y)    # this rank's loss on its own batch
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if buggy:
                writes = True                              # BUG: every rank appends to the same file
            else:
                writes = dist.get_rank() == 0              # FIX: rank 0 alone writes
            if writes:
                with open(Path(folder, "train.log"), "a") as log:
                    log.write(f"epoch {epoch} loss {loss.item():.4f}\n")
        return
    # The harness: 2 ranks train 3 epochs with the code above, then the log is read.
    with tempfile.TemporaryDirectory() as folder:
        _checked(run_ranks(every_rank_writes_the_log, 2, buggy=buggy, in_rank=True, folder=folder), "log")
        lines = Path(folder, "train.log").read_text().splitlines()
    losses = defaultdict(set)
    for line in lines:                                     # "epoch 1 loss 1.0764"
        epoch, loss = line.split(" loss ")
        losses[epoch].add(loss)
    conflicting = sum(len(values) > 1 for values in losses.values())
    return Outcome(
        figures={"epochs in train.log": len(losses), "lines in train.log": len(lines),
                 "epochs with two losses": conflicting},
        checks=[Check("lines in train.log for 3 epochs", len(lines), "> 3"),
                Check("epochs logged with two different losses", conflicting, ">= 1")])


@pitfall(
    id="ddp-forward-on-one-rank", chapter=7,
    title="A forward through the DDP model on rank 0 only (to profile or to log a prediction) puts the ranks' "
          "collectives out of step: a forward with gradients through a BatchNorm model hangs the job",
    symptom="with BatchNorm in the model and a forward with gradients on rank 0 after each step, the ranks wait "
            "until the process group's timeout (2 s here; by default 30 minutes for gloo, 10 for nccl) and a rank "
            "ends with gloo's timeout error (its peer may report the closed connection instead)",
    why="""Every rank must issue the same collectives in the same order, and a forward through the DDP wrapper
    issues some. At the start of the first forward, and of a forward that follows a forward run with gradients
    outside no_sync(), DDP broadcasts rank 0's buffers (BatchNorm's running statistics) to the other ranks; and
    once per run, in the first forward with
    gradients after the first backward, it broadcasts the order of its gradient buckets. An extra forward on
    rank 0 alone adds such a broadcast there, so rank 0 waits in a collective the other rank never starts,
    and both wait until the timeout. Without buffers the extra forward hangs only if it carries the once-per-run
    broadcast; with BatchNorm under torch.no_grad() it may abort, hang, or happen to pair with the other rank's
    next broadcast. Which one depends on where it falls, so never rely on it.""",
    catch="""Run rank-0-only work (profiling, a prediction to log, evaluation, a plot) on model.module, the plain
    model, in eval mode and under torch.no_grad(): the plain model issues no collective, and eval mode keeps a
    small batch out of BatchNorm's running statistics, which DDP would then broadcast to every rank. Or run it
    on every rank. Start jobs with a process-group timeout you can afford to wait (init_process_group(
    timeout=...)), so a mismatch ends the job with an error instead of holding the machines.""",
)
def forward_on_one_rank(buggy: bool, in_rank: bool = False):
    if in_rank:                                            # what each of the 2 ranks runs
        model = DDP(_mlp(batchnorm=True))                  # BatchNorm: buffers DDP broadcasts in forward
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for X, y in _batches(4):
            loss = nn.functional.cross_entropy(model(X), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if dist.get_rank() == 0:                       # a look at a prediction, on rank 0 only
                if buggy:
                    preview = model(X[:2])                 # BUG: through DDP: one more broadcast on rank 0
                else:
                    model.module.eval()                    # FIX: the plain model, in eval mode, no gradients:
                    with torch.no_grad():                  # FIX: no collective, no statistics updated
                        preview = model.module(X[:2])      # FIX
                    model.module.train()                   # FIX
                preview.argmax(1)
        dist.barrier()
        return
    # The harness: 2 ranks run the code above with a 2 s collective timeout; how did the job end?
    run = run_ranks(forward_on_one_rank, 2, collective_timeout_s=2.0, timeout_s=60.0, buggy=buggy, in_rank=True)
    error = run.error or "none"
    # The rank whose collective times out ('Timed out waiting 2000ms ...', 'Application timeout caused
    # pair closure') closes its connections, so its peer may report 'Connection closed by peer' first.
    timed_out = any("timed out" in line.lower() or "timeout" in line.lower() for line in run.errors.values())
    return Outcome(
        figures={"error type": error.split(":")[0], "gloo timed out": timed_out,
                 "seconds until it ended": run.seconds},
        checks=[Check("a rank failed", bool(run.errors), "is True"),
                Check("a rank ended with gloo's timeout error", timed_out, "is True")])


@pitfall(
    id="ddp-unused-parameter", chapter=7,
    title="A parameter that forward never uses makes DDP's second iteration raise",
    symptom="with a layer forward never calls, the forward of step 2 raises RuntimeError: Expected to have "
            "finished reduction in the prior iteration before starting a new one",
    why="""DDP all-reduces gradients in buckets, and a bucket is reduced once every parameter in it has
    received its gradient in backward. A parameter that took no part in the forward never receives one,
    so its bucket is never reduced and the iteration never finishes. Backward itself returns without
    an error; the next forward checks that the previous reduction finished, and raises. The message
    gives the indices (in `model.parameters()` order) of the parameters that got no gradient, and their
    names when the environment variable TORCH_DISTRIBUTED_DEBUG is INFO. `find_unused_parameters=True`
    makes DDP walk the autograd graph after each forward and mark the parameters it does not reach as
    ready, at the cost of that walk and of one more all-reduce (which parameters each rank used) every
    step.""",
    catch="""Remove the parameters forward does not use (or freeze them with requires_grad_(False) before
    wrapping). When the unused set is the same at every step, static_graph=True also works; use
    find_unused_parameters=True when it changes from step to step (branches, mixture-of-experts). Run
    two steps of every new model under DDP before a long job: the error only shows at the second. With
    static_graph=True, a parameter that leaves the graph at step k raises only at step k + 1's forward,
    after step k has already trained the ranks apart.""",
)
def ddp_unused_parameter(buggy: bool, in_rank: bool = False):
    if in_rank:                                            # what each of the 2 ranks runs
        if buggy:
            model = DDP(WithAuxHead())                     # BUG: DDP waits for a gradient of aux every step
        else:
            model = DDP(WithAuxHead(), find_unused_parameters=True)  # FIX: marks aux ready after each forward
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step, (X, y) in enumerate(_batches(3), start=1):
            try:
                loss = nn.functional.cross_entropy(model(X), y)
            except RuntimeError as err:
                return {"step": step, "error": str(err)}
            optimizer.zero_grad()
            loss.backward()                                # gradients averaged over the ranks
            optimizer.step()
        return {"step": 0, "error": "none", "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}
    # The harness: 2 ranks run the code above; how far did they get, and do their weights agree?
    ranks = _checked(run_ranks(ddp_unused_parameter, 2, buggy=buggy, in_rank=True), "unused parameter")
    error = ranks[0]["error"].split(".")[0]                # the message's first sentence
    named = ranks[0]["error"].partition("did not receive grad for rank 0: ")[2]   # 'Parameter indices which ...'
    indices = named.splitlines()[0].split() if named else []
    names = dict(enumerate(name for name, _ in WithAuxHead().named_parameters()))
    agree = (torch.equal(ranks[0]["weights"], ranks[1]["weights"]) if "weights" in ranks[0]
             else "no: training stopped at the error")
    return Outcome(
        figures={"rank 0 raised at step": ranks[0]["step"] or "none (3 steps ran)", "rank 0's error": error,
                 "parameters it names by index": ", ".join(f"{i} ({names[int(i)]})" for i in indices) or "none",
                 "rank 1 raised at step": ranks[1]["step"] or "none (3 steps ran)",
                 "the ranks end with identical weights": agree},
        checks=[Check("rank 0's error", error, "contains 'Expected to have finished reduction in the prior iteration "
                      "before starting a new one'"),
                Check("the step at which rank 0 raised", ranks[0]["step"], "== 2")])


@pitfall(
    id="ddp-metric-on-rank-zero-only", chapter=7,
    title="Validation accuracy computed on each rank and printed by rank 0 describes rank 0's shard, not the "
          "validation set",
    symptom="rank 0 reports an accuracy over its own 32 of the 64 validation examples, more than 0.1 away from "
            "the accuracy one process measures over all 64",
    why="""DistributedSampler deals every rank its own shard of the validation set (indices rank, rank +
    world_size, ... without shuffling), so the correct predictions one rank counts are those of its shard, and
    rank 0, the one that prints, prints its shard's accuracy: 1/world_size of the data. Shards of a shuffled set
    often differ little, which is why the mistake goes unnoticed; an ordered set can make them differ a lot.
    Here each clean example is followed by a noisy copy of it, so rank 0 gets every clean example and rank 1
    every noisy one. Adding the ranks' counts before dividing is exact; averaging the ranks' accuracies is exact
    only when the shards have equal sizes. When the size does not divide by the world size, the sampler pads the
    last round with the first indices (drop_last=False, the default), and the padded examples count at least twice
    even after the all-reduce (64 divides by 2 here, so no example is repeated).""",
    catch="""Count on every rank, then add the counts before dividing: counts = torch.tensor([correct, total],
    device=device) (on the rank's GPU under nccl); dist.all_reduce(counts, op=dist.ReduceOp.SUM), on every rank
    since it is a collective; then rank 0 prints
    counts[0] / counts[1]. Check that the total equals len(val_set): a larger one means padding was counted
    (evaluate unpadded slices, or the whole set on rank 0 with model.module while the others wait at a barrier).""",
)
def metric_on_rank_zero_only(buggy: bool, in_rank: bool = False):
    if in_rank:                                            # what each of the 2 ranks runs
        val_set = TensorDataset(*paired_validation_set())  # 64 examples: clean, its noisy copy, clean, ...
        sampler = DistributedSampler(val_set, shuffle=False)   # this rank's 32: 64 divides by 2, no padding
        model = prototype_classifier()                     # the same weights on every rank
        correct = total = 0
        with torch.no_grad():
            for X, y in DataLoader(val_set, batch_size=8, sampler=sampler):
                correct += (model(X).argmax(1) == y).sum().item()
                total += len(y)
        counts = torch.tensor([correct, total])            # this rank's shard: (correct, seen)
        if buggy:
            pass                                           # BUG: rank 0 divides its own shard's counts
        else:
            dist.all_reduce(counts, op=dist.ReduceOp.SUM)  # FIX: the counts of every rank, added
        if dist.get_rank() == 0:                           # rank 0 prints accuracy = correct / seen
            return {"accuracy": (counts[0] / counts[1]).item(), "seen": counts[1].item()}
        return None
    # The harness: 2 ranks run the code above; one process then measures the accuracy over the whole set.
    reported = _checked(run_ranks(metric_on_rank_zero_only, 2, buggy=buggy, in_rank=True), "metric")[0]
    X, y = paired_validation_set()
    with torch.no_grad():
        whole = (prototype_classifier()(X).argmax(1) == y).float().mean().item()
    return Outcome(
        figures={"accuracy rank 0 reports": reported["accuracy"], "examples behind it": reported["seen"],
                 "accuracy over all 64 (one process)": whole},
        checks=[Check("|rank 0's accuracy - one process's over all 64|", abs(reported["accuracy"] - whole), "> 0.1"),
                Check("examples behind rank 0's figure (of 64)", reported["seen"], "== 32")])


@pitfall(
    id="ddp-accumulation-without-no-sync", chapter=7,
    title="Gradient accumulation under DDP without no_sync(): every micro-batch's backward all-reduces",
    symptom="accumulating 4 micro-batches per optimizer step, DDP all-reduces the model's one gradient bucket "
            "4 times per step (once with no_sync)",
    why="""DDP hooks into backward: as soon as every gradient in a bucket is ready, it all-reduces the bucket
    (averages it over the ranks). It cannot know that another backward will add to .grad before the optimizer
    steps, so each of the k backwards of an accumulation all-reduces: k times the communication of one step.
    Nothing else shows it: the all-reduce averages what .grad holds, and averaging after each micro-batch then
    adding gives the same gradient as adding first and averaging once, up to float rounding. Inside
    `with model.no_sync():` DDP skips the all-reduce and .grad accumulates on each rank alone; the first
    backward outside it all-reduces the sum. The forward must run inside no_sync() too: DDP prepares the
    reduction of the coming backward in forward. The hook here is called once per bucket and synchronising
    backward (never under no_sync); the model's 195 floats make a single bucket (buckets hold up to 25 MiB by
    default, bucket_cap_mb; the first up to 1 MiB), so one call is one all-reduce of every gradient. A large
    model has many buckets, each all-reduced k times.""",
    catch="""Run the forward and backward of the first k-1 micro-batches under `with model.no_sync():` and the
    last one outside it, then step. To see what DDP sends, register a communication hook that counts each
    call and then calls torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook (DDP's
    default, the mean), as this reproduction does.""",
)
def accumulation_without_no_sync(buggy: bool, in_rank: bool = False, k: int = 4, steps: int = 3):
    if in_rank:                                            # what each of the 2 ranks runs
        model = DDP(_mlp())                                # 195 floats: one gradient bucket
        calls = []
        model.register_comm_hook(calls, counted_allreduce)  # records each bucket all-reduce, then runs it
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = _batches(steps * k)                      # this rank's micro-batches of 8
        for step in range(steps):
            for i, (X, y) in enumerate(batches[step * k:(step + 1) * k]):
                if buggy:
                    sync = contextlib.nullcontext()        # BUG: every backward all-reduces
                else:
                    sync = model.no_sync() if i < k - 1 else contextlib.nullcontext()   # FIX: the last only
                with sync:                                 # forward and backward inside
                    (nn.functional.cross_entropy(model(X), y) / k).backward()   # adds to .grad
            optimizer.step()
            optimizer.zero_grad()
        return {"calls": calls, "weights": torch.cat([p.detach().flatten() for p in model.parameters()])}
    # The harness: 2 ranks run the code above; one process then accumulates both ranks' micro-batches alone.
    ranks = _checked(run_ranks(accumulation_without_no_sync, 2, buggy=buggy, in_rank=True, k=k, steps=steps),
                     "accumulation")
    calls = ranks[0]["calls"]
    with torch.random.fork_rng(devices=[]):                # _mlp() seeds; the caller's generator is left as it was
        alone = _mlp()
    optimizer = torch.optim.SGD(alone.parameters(), lr=0.1)
    batches = [_batches(steps * k, rank=r) for r in range(2)]
    for step in range(steps):
        for X, y in (b for rank_batches in batches for b in rank_batches[step * k:(step + 1) * k]):
            (nn.functional.cross_entropy(alone(X), y) / (2 * k)).backward()
        optimizer.step()
        optimizer.zero_grad()
    weights = torch.cat([p.detach().flatten() for p in alone.parameters()])
    per_step = len(calls) // steps if len(calls) % steps == 0 else len(calls) / steps
    return Outcome(
        figures={"all-reduces per optimizer step": per_step,
                 "gradient buckets": len({index for index, _ in calls}),
                 "floats all-reduced per optimizer step": sum(n for _, n in calls) // steps,
                 "the 2 ranks end with identical weights": torch.equal(ranks[0]["weights"], ranks[1]["weights"]),
                 "largest |weight - one process's|": (ranks[0]["weights"] - weights).abs().max().item()},
        checks=[Check(f"bucket all-reduces in {steps} optimizer steps of {k} micro-batches", len(calls),
                      f"== {steps * k}")])
