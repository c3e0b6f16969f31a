"""The reference training script: SmallCNN on the embedded data, one command for one process or many.

  python -m ptlab train --epochs 3                               # one process
  torchrun --nproc-per-node=2 -m ptlab train --epochs 3          # 2 processes on this machine
  torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-id=job42 \\
           --rdzv-endpoint=node0:29500 -m ptlab train --epochs 30  # the same line on every machine

Under torchrun every process runs this file; RANK, LOCAL_RANK and WORLD_SIZE say which one it is. Each
process trains on GPU LOCAL_RANK with nccl when the machine has a GPU for every one of its processes, and on
the CPU with gloo otherwise (PTLAB_DEVICE=cpu forces the CPU). Rank 0 alone prints, shows the progress bar,
writes checkpoints and the run log; --batch-size is the global batch, divided evenly among the processes (it
must divide by their number). The train loss and accuracy logged are the mean over the ranks; every rank
evaluates the whole validation split each epoch (the same weights: the same figure), and rank 0 alone runs the
test evaluation, on the plain model. Under torchrun DataLoader workers start with forkserver (spawn off Linux),
never fork. One process
resumes bit for bit; several ranks resume with their own new random streams (last.pt holds only rank 0's), so
their augmentations differ from an uninterrupted run's.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset

from ptlab.profiling import profile_training

from .checkpoint import load_checkpoint
from .core import DEVICE_ENV, get_device
from .data import DATASET_NAMES, load_dataset, make_transform, train_val_split
from .distributed import collective_device, default_start_method
from .experiments import log_run
from .models import SmallCNN
from .train import History, evaluate, fit, resume_run


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the help, and the description's examples as written."""


def build_parser() -> argparse.ArgumentParser:
    """Every option, with its default shown in --help."""
    p = argparse.ArgumentParser(prog="python -m ptlab train", description=__doc__, formatter_class=Formatter)
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs of the whole run, those done before a resume included (None: 3, or 1 with --dry-run)")
    p.add_argument("--batch-size", type=int, default=128, help="global batch, split evenly across the processes")
    p.add_argument("--lr", type=float, default=2e-3, help="AdamW learning rate")
    p.add_argument("--weight-decay", type=float, default=5e-4, help="AdamW weight decay")
    p.add_argument("--width", type=int, default=32, help="SmallCNN channels in its first stage")
    p.add_argument("--dataset", choices=DATASET_NAMES, default="embedded", help="training data")
    p.add_argument("--val-fraction", type=float, default=0.1, help="share of the training split kept for validation")
    p.add_argument("--augment", action=argparse.BooleanOptionalAction, default=True, help="random crop and flip")
    p.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the split and the shuffling")
    p.add_argument("--checkpoint-dir", default="checkpoints", help="last.pt every epoch, best.pt on a new best")
    p.add_argument("--resume", action="store_true", help="continue from CHECKPOINT_DIR/last.pt")
    p.add_argument("--runs-dir", default="runs", help="the experiment log (runs.jsonl) goes here")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=True,
                   help="mixed precision on CUDA: bfloat16 autocast on a GPU with native bfloat16 (Ampere or "
                        "newer), else float16 autocast + GradScaler; none on the CPU (see --cpu-bf16)")
    p.add_argument("--cpu-bf16", action="store_true",
                   help="bfloat16 autocast on the CPU (faster only with native bf16, e.g. AVX-512 BF16 or AMX)")
    p.add_argument("--profile", action="store_true", help="rank 0 profiles 5 steps of a copy of the model first")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds a collective waits for the other ranks")
    p.add_argument("--dry-run", action="store_true", help="a few batches per epoch: check the setup (CI)")
    p.add_argument("--fail-rank", type=int, default=None,
                   help="testing: this rank raises at its second batch, to check that the whole job ends")
    return p


class EpochSettingLoader:
    """A DataLoader that calls sampler.set_epoch(n) before its n-th pass, so a DistributedSampler reshuffles."""

    def __init__(self, loader: DataLoader, first_epoch: int = 0, fail_rank: int | None = None) -> None:
        self.loader, self.epoch, self.fail_rank = loader, first_epoch, fail_rank

    def __iter__(self):
        if hasattr(self.loader.sampler, "set_epoch"):
            self.loader.sampler.set_epoch(self.epoch)
        self.epoch += 1
        for i, batch in enumerate(self.loader):
            if i == 1 and self.fail_rank == int(os.environ.get("RANK", 0)):
                raise RuntimeError(f"rank {self.fail_rank} failed on purpose (--fail-rank)")
            yield batch

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str):
        return getattr(self.loader, name)              # fit checkpoints loader.generator, for instance


@dataclass(frozen=True)
class RankDevice:
    """Where one process of a torchrun job trains, the process-group backend that goes with it, and why."""

    device: torch.device
    backend: str
    note: str | None = None       # set when the process does not train where the machine's choice would put it


def rank_device(kind: str, local_rank: int, local_world_size: int, cuda_devices: int) -> RankDevice:
    """The device and backend of process `local_rank` of `local_world_size` on one machine.

    `kind` is what the machine would use for one process ("cuda", "mps" or "cpu": `ptlab.core.get_device`, so
    PTLAB_DEVICE overrides it) and `cuda_devices` how many GPUs the process sees. nccl needs a GPU of its own
    for every process, so with fewer GPUs than processes on the machine the job trains on the CPU with gloo;
    torch.distributed has no backend for Apple's MPS, so there too.
    """
    if kind == "cuda" and cuda_devices >= local_world_size:
        return RankDevice(torch.device("cuda", local_rank), "nccl")
    if kind == "cuda":
        return RankDevice(torch.device("cpu"), "gloo",
                          f"{local_world_size} processes on this machine but {cuda_devices} CUDA device(s): nccl "
                          "needs a GPU for each process, so every process trains on the CPU with gloo (with "
                          f"--nproc-per-node={cuda_devices} each process gets a GPU)")
    if kind == "mps":
        return RankDevice(torch.device("cpu"), "gloo",
                          "torch.distributed has no backend for Apple's MPS: every process trains on the CPU with gloo")
    return RankDevice(torch.device("cpu"), "gloo")


def setup_distributed(timeout_s: float) -> tuple[int, int, torch.device]:
    """(rank, world size, device). Under torchrun, join the process group on the device `rank_device` picks.

    Rank 0 prints why when the processes cannot train where one process would (fewer GPUs than processes).
    """
    if "RANK" not in os.environ:                       # a plain `python -m ptlab train`
        return 0, 1, get_device()
    rank, world, local_rank = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if os.environ.get(DEVICE_ENV, "").strip():        # PTLAB_DEVICE, checked by get_device
        kind = get_device().type
    else:                                              # get_device's order, without touching GPU 0 in every rank
        kind = "cuda" if cuda_devices else "mps" if torch.backends.mps.is_available() else "cpu"
    choice = rank_device(kind, local_rank, local_world, cuda_devices)
    if choice.note and rank == 0:
        print(choice.note)
    timeout = datetime.timedelta(seconds=timeout_s)
    if choice.backend == "nccl":
        torch.cuda.set_device(choice.device)           # before the group makes any CUDA tensor
        dist.init_process_group("nccl", timeout=timeout, device_id=choice.device)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return rank, world, choice.device


def amp_settings(device: torch.device, amp: bool, cpu_bf16: bool, cuda_bf16: bool | None = None):
    """(GradScaler or None, autocast dtype or None, description), chosen by the device (docs/decisions.md, row 4).

    On a CUDA GPU: bfloat16 where the GPU runs it natively (float32's range: no scaler), else float16 with a
    GradScaler. cuda_bf16=None asks torch.cuda.is_bf16_supported(including_emulation=False): True from Ampere
    on (compute capability 8.0); its default, including_emulation=True, is True on older GPUs too."""
    if device.type == "cuda" and amp:
        if torch.cuda.is_bf16_supported(including_emulation=False) if cuda_bf16 is None else cuda_bf16:
            return None, torch.bfloat16, "bfloat16 autocast (no GradScaler: bf16 has float32's range)"
        return torch.amp.GradScaler("cuda"), torch.float16, "float16 autocast + GradScaler"
    if device.type == "cpu" and cpu_bf16:
        return None, torch.bfloat16, "bfloat16 autocast"
    return None, None, "off" + (" (--cpu-bf16 to use bfloat16)" if device.type == "cpu" else "")


def make_loaders(args: argparse.Namespace, rank: int, world: int, pin_memory: bool = False):
    """Train (sharded across ranks), validation and test loaders; dry runs take a few batches.

    pin_memory=True (for a CUDA GPU, docs/decisions.md row 2) pins each training batch, so fit copies it with
    non_blocking=True."""
    train_set = load_dataset(True, make_transform(augment=args.augment), name=args.dataset)
    plain_set = load_dataset(True, make_transform(), name=args.dataset)        # validation: no augmentation
    train_idx, val_idx = train_val_split(train_set.targets, args.val_fraction, seed=args.seed)
    if args.dry_run:
        train_idx, val_idx = train_idx[:4 * args.batch_size], val_idx[:args.batch_size]
    train = Subset(train_set, train_idx)
    per_rank = args.batch_size // world
    if world > 1:                                      # each rank its own disjoint shard, reshuffled each epoch
        sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        # Workers beside a process group: forkserver or spawn, never fork (DDP's docstring warns about fork
        # with nccl); no generator=, so each rank's workers take their seeds from its own seed + rank.
        context = default_start_method() if args.workers else None
        loader = DataLoader(train, batch_size=per_rank, sampler=sampler, num_workers=args.workers,
                            pin_memory=pin_memory, multiprocessing_context=context)
    else:
        loader = DataLoader(train, batch_size=per_rank, shuffle=True, num_workers=args.workers,
                            generator=torch.Generator().manual_seed(args.seed), pin_memory=pin_memory)
    val = DataLoader(Subset(plain_set, val_idx), batch_size=256)
    test_set = load_dataset(False, make_transform(), name=args.dataset)
    test = DataLoader(Subset(test_set, range(256)) if args.dry_run else test_set, batch_size=256)
    return EpochSettingLoader(loader, fail_rank=args.fail_rank), val, test


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Train, checkpoint and log; returns the exit code."""
    folder = Path(args.checkpoint_dir)
    if args.resume and not (folder / "last.pt").is_file():
        parser.error(f"--resume: no checkpoint at {folder / 'last.pt'}; run once without --resume first")
    rank, world, device = setup_distributed(args.timeout)
    main = rank == 0
    say = print if main else (lambda *a, **k: None)
    epochs = args.epochs or (1 if args.dry_run else 3)
    train_loader, val_loader, test_loader = make_loaders(args, rank, world, pin_memory=device.type == "cuda")
    scaler, autocast_dtype, amp_text = amp_settings(device, args.amp, args.cpu_bf16)
    say(f"world size {world} ({dist.get_backend() if world > 1 else 'one process'}), device {device.type}, "
        f"batch {args.batch_size // world} per rank ({args.batch_size // world * world} in all), AMP: {amp_text}")
    say(f"{len(train_loader.dataset)} training images, {len(val_loader.dataset)} validation, "
        f"{len(test_loader.dataset)} test" + (" (dry run: a few batches per epoch)" if args.dry_run else ""))

    torch.manual_seed(args.seed)                       # the same initial weights on every rank
    model = SmallCNN(width=args.width).to(device)      # (B, 3, 32, 32) -> (B, 10)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    torch.manual_seed(args.seed + rank)                # each rank its own augmentations (a resume restores the RNGs)
    history = None
    if args.resume:                                    # every rank reads the same file; the plain model's keys
        try:
            history = resume_run(folder, model, optimizer, train_loader=train_loader, scaler=scaler)
        except RuntimeError as err:                    # load_state_dict: size mismatch, missing or unexpected keys
            if "state_dict" not in str(err):
                raise
            parser.error(f"--resume: {folder / 'last.pt'} holds another model than --width {args.width} builds "
                         f"({str(err).splitlines()[-1].strip()}); resume with the settings it was trained with, "
                         "or start a new run in another --checkpoint-dir")
        say(f"resumed from {folder / 'last.pt'} after epoch {history.epoch[-1]}")
        if world > 1:                                  # last.pt holds rank 0's RNG: give each rank its own again
            torch.manual_seed(args.seed + rank + 1000 * len(history))
        if len(history) >= epochs:
            say(f"the run in {folder} already has {len(history)} epochs (--epochs {epochs}): nothing to train, "
                "nothing logged; raise --epochs to train on")
            return 0
    if args.profile and main:                          # a copy, on rank 0 only: no collective involved
        probe = copy.deepcopy(model)
        print(profile_training(probe, train_loader.loader, torch.optim.AdamW(probe.parameters()), steps=5))
    if world > 1:
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    done = len(history) if history is not None else 0
    train_loader.epoch = done                          # set_epoch continues where the run stopped
    if epochs > done:
        history = fit(model, train_loader, val_loader, optimizer, epochs=epochs - done, history=history,
                      device=device, scaler=scaler, autocast_dtype=autocast_dtype, progress=main,
                      checkpoint_dir=folder if main else None)   # rank 0 alone writes checkpoints
    if world > 1:                                      # each rank trained on its own shard: log the mean
        _average_over_ranks(history, ("train_loss", "train_acc"), world, device)
    if main:                                           # evaluation and the log: rank 0, on the plain model
        plain = model.module if isinstance(model, DDP) else model
        load_checkpoint(folder / "best.pt", plain, restore_random=False)  # chosen on validation
        test = evaluate(plain, test_loader, device=device)
        for e, tl, va in zip(history.epoch, history.train_loss, history.val_acc):
            print(f"epoch {e}: train loss {tl:.4f}, validation accuracy {va:.4f}")
        best = history.epoch.index(history.best_epoch)
        config = {**{k: v for k, v in vars(args).items() if k != "fail_rank"}, "world_size": world,
                  "device": device.type, "amp": amp_text}
        logged = log_run(config, {"best_epoch": history.best_epoch, "val_acc": history.val_acc[best],
                                  "test_acc": test["acc"]}, history=history,
                         checkpoint=folder / "best.pt", runs_dir=args.runs_dir)
        print(f"test accuracy {test['acc']:.4f} with the weights of epoch {history.best_epoch} (best validation "
              f"accuracy); checkpoints in {folder}; logged as {logged.name} in {Path(args.runs_dir) / 'runs.jsonl'}")
    return 0


def _average_over_ranks(history: History, fields: tuple[str, ...], world: int, device: torch.device) -> None:
    """Replace each rank's own curve by the mean over all ranks (equal shards: the mean over every sample).

    `device` is the rank's: under nccl the tensor must be on its GPU (collective_device)."""
    where = collective_device(dist.get_backend(), device)
    for name in fields:
        values = torch.tensor(getattr(history, name), dtype=torch.float64).to(where)   # (epochs,)
        dist.all_reduce(values)                        # gloo sums float64 on the CPU, nccl on the rank's GPU
        setattr(history, name, (values / world).cpu().tolist())


def check_arguments(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """One usage line for a value that would otherwise end in a traceback deep inside torch."""
    for name in ("epochs", "batch_size", "width"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not (math.isfinite(args.lr) and args.lr > 0):
        parser.error(f"--lr must be a positive number, got {args.lr}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        parser.error(f"--weight-decay must be 0 or more, got {args.weight_decay}")
    if not 0 < args.val_fraction < 1:
        parser.error(f"--val-fraction must be between 0 and 1 (the share kept for validation), got {args.val_fraction}")
    if args.workers < 0:
        parser.error(f"--workers must be 0 (load in the main process) or more, got {args.workers}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be a positive number of seconds, got {args.timeout}")
    world = int(os.environ.get("WORLD_SIZE", 1))
    if args.batch_size < world:
        parser.error(f"--batch-size {args.batch_size} is smaller than the world size {world}: "
                     "every process needs at least one example per step")
    if args.batch_size % world:
        parser.error(f"--batch-size {args.batch_size} does not divide by the world size {world}: each process takes "
                     f"batch-size / world size examples, so {args.batch_size % world} would be dropped every step; "
                     f"use a multiple of {world}")


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m ptlab train` (and of every process torchrun starts)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    check_arguments(args, parser)
    try:
        return run(args, parser)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
