"""The reference training script: one process, torchrun with 2 processes on gloo, resume, clear errors."""
import json
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from ptlab.distributed import run_torchrun
import ptlab.train_script as train_script
from ptlab.train_script import EpochSettingLoader, amp_settings, build_parser, main, rank_device

SMALL = ["--dry-run", "--width", "8", "--batch-size", "32"]
ON_CPU = {"PTLAB_DEVICE": "cpu"}          # gloo on every machine, a GPU one included: the output is the same


def read_runs(folder):
    return [json.loads(line) for line in (folder / "runs" / "runs.jsonl").read_text().splitlines()]


def test_help_shows_every_default():
    text = " ".join(build_parser().format_help().split())       # argparse wraps lines at the terminal width
    for default in ("(default: 128)", "(default: embedded)", "(default: checkpoints)", "(default: runs)"):
        assert default in text
    assert "torchrun --nproc-per-node=2 -m ptlab train" in text


def test_dry_run_single_process_checkpoints_and_logs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PTLAB_DEVICE", "cpu")                   # the same run, and AMP off, on a GPU machine too
    assert main(SMALL) == 0
    out = capsys.readouterr().out
    assert "world size 1 (one process)" in out and "AMP: off" in out
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["best.pt", "last.pt"]
    [run] = read_runs(tmp_path)
    assert run["config"]["world_size"] == 1 and len(run["curves"]["val_acc"]) == 1
    assert run["checkpoint"] == "checkpoints/best.pt"

    assert main([*SMALL, "--resume", "--epochs", "2"]) == 0      # one more epoch from last.pt
    assert "resumed from checkpoints/last.pt after epoch 1" in capsys.readouterr().out
    runs = read_runs(tmp_path)
    assert len(runs) == 2 and runs[1]["curves"]["epoch"] == [1, 2]
    assert runs[1]["curves"]["val_acc"][0] == runs[0]["curves"]["val_acc"][0]


def test_bad_arguments_get_one_clear_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for argv, message in ((["--dataset", "mnist"], "invalid choice: 'mnist'"),
                          (["--resume"], "--resume: no checkpoint at checkpoints/last.pt"),
                          (["--epochs", "0"], "--epochs must be at least 1")):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    monkeypatch.setenv("WORLD_SIZE", "4")                        # as torchrun would set it, before any group
    with pytest.raises(SystemExit):
        main(["--batch-size", "2"])
    assert "--batch-size 2 is smaller than the world size 4" in capsys.readouterr().err


def test_epoch_setting_loader_reshuffles_each_pass_and_passes_attributes_through():
    sampler = DistributedSampler(range(16), num_replicas=2, rank=0, seed=0)
    loader = EpochSettingLoader(DataLoader(range(16), batch_size=4, sampler=sampler), first_epoch=3)
    first, second = [b.tolist() for b in loader], [b.tolist() for b in loader]
    assert first != second and loader.epoch == 5 and len(loader) == 2
    sampler.set_epoch(3)
    assert sum(first, []) == list(sampler)                       # the first pass was epoch 3
    assert loader.batch_size == 4 and loader.generator is None


def test_amp_is_chosen_by_device():
    assert amp_settings(torch.device("cpu"), True, False)[:2] == (None, None)
    assert amp_settings(torch.device("cpu"), True, True)[1] is torch.bfloat16
    with warnings.catch_warnings():                                # "CUDA is not available. Disabling." here
        warnings.simplefilter("ignore", UserWarning)
        scaler, dtype, text = amp_settings(torch.device("cuda"), True, False, cuda_bf16=False)
    assert isinstance(scaler, torch.amp.GradScaler) and dtype is torch.float16 and "GradScaler" in text
    assert amp_settings(torch.device("cuda"), True, False, cuda_bf16=True)[:2] == (None, torch.bfloat16)
    assert amp_settings(torch.device("cuda"), False, False)[:2] == (None, None)


def test_the_loaders_pin_memory_exactly_when_asked(tmp_path, monkeypatch):
    """docs/decisions.md row 2: pinned batches only for a CUDA GPU (run passes device.type == "cuda")."""
    args = build_parser().parse_args(SMALL)
    for pin in (False, True):
        train, val, test = train_script.make_loaders(args, 0, 1, pin_memory=pin)
        assert train.loader.pin_memory is pin and not val.pin_memory and not test.pin_memory


def test_workers_beside_a_process_group_never_fork():
    """DDP's docstring: with nccl and DataLoader workers, use forkserver or spawn; one process keeps the default."""
    from ptlab.distributed import default_start_method

    args = build_parser().parse_args([*SMALL, "--workers", "1"])
    ranked = train_script.make_loaders(args, 1, 2)[0].loader
    alone = train_script.make_loaders(args, 0, 1)[0].loader
    assert ranked.multiprocessing_context.get_start_method() == default_start_method() != "fork"
    assert alone.multiprocessing_context is None


@pytest.mark.slow
def test_torchrun_two_processes_on_gloo_dry_run(tmp_path):
    result = run_torchrun(["-m", "ptlab", "train", *SMALL], nproc=2, cwd=tmp_path, timeout_s=240, env=ON_CPU)
    assert result.returncode == 0 and not result.timed_out, result.stderr[-3000:]
    assert result.stdout.count("world size 2 (gloo)") == 1            # rank 0 alone prints
    assert "batch 16 per rank (32 in all)" in result.stdout
    [run] = read_runs(tmp_path)                                        # rank 0 alone logs
    assert run["config"]["world_size"] == 2
    state = torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)
    assert not any(key.startswith("module.") for key in state["model"])   # the plain model's keys


@pytest.mark.slow
def test_torchrun_a_failing_rank_ends_the_job_with_its_error(tmp_path):
    # A collective timeout far longer than the launch timeout: only failure detection can end the job in time.
    result = run_torchrun(["-m", "ptlab", "train", *SMALL, "--fail-rank", "1", "--timeout", "900"], nproc=2,
                          cwd=tmp_path, timeout_s=240, env=ON_CPU)
    assert not result.timed_out, f"the job hung for {result.seconds:.0f} s"
    assert result.returncode != 0 and result.root_cause_rank == 1
    assert result.error_of(1) == "RuntimeError: rank 1 failed on purpose (--fail-rank)"
    assert not (tmp_path / "runs").exists()                            # no run logged for a failed job


@pytest.mark.slow
def test_torchrun_batch_smaller_than_world_size_is_refused(tmp_path):
    result = run_torchrun(["-m", "ptlab", "train", "--batch-size", "1"], nproc=2, cwd=tmp_path, timeout_s=240,
                          env=ON_CPU)
    assert result.returncode != 0 and not result.timed_out
    assert result.usage_errors == ["python -m ptlab train: error: --batch-size 1 is smaller than the world size 2: "
                                   "every process needs at least one example per step"]


def test_rank_device_gives_each_process_a_gpu_of_its_own_or_the_cpu():
    assert rank_device("cuda", 1, 2, 2) == train_script.RankDevice(torch.device("cuda", 1), "nccl")
    assert rank_device("cuda", 3, 8, 8).device == torch.device("cuda", 3)
    one_gpu = rank_device("cuda", 1, 2, 1)                      # rank 1 would ask for cuda:1, which is not there
    assert (one_gpu.device, one_gpu.backend) == (torch.device("cpu"), "gloo")
    assert one_gpu.note.startswith("2 processes on this machine but 1 CUDA device(s)")
    assert "--nproc-per-node=1" in one_gpu.note
    mps = rank_device("mps", 0, 2, 0)
    assert (mps.device, mps.backend) == (torch.device("cpu"), "gloo") and "MPS" in mps.note
    assert rank_device("cpu", 1, 2, 4) == train_script.RankDevice(torch.device("cpu"), "gloo")   # PTLAB_DEVICE=cpu


def _fake_machine(monkeypatch, *, gpus=0, mps=False, rank=1, world=2, **env):
    """A torchrun process on a machine with `gpus` CUDA devices, without joining any group: what would it do?"""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setattr(train_script.dist, "init_process_group",
                        lambda backend, **kwargs: calls.append((backend, kwargs.get("device_id"))))
    monkeypatch.delenv("PTLAB_DEVICE", raising=False)
    for name, value in {"RANK": rank, "LOCAL_RANK": rank, "WORLD_SIZE": world, "LOCAL_WORLD_SIZE": world,
                        **env}.items():
        monkeypatch.setenv(name, str(value))
    return calls


def test_setup_distributed_with_one_gpu_for_two_processes_trains_on_the_cpu(monkeypatch, capsys):
    calls = _fake_machine(monkeypatch, gpus=1, rank=1)
    assert train_script.setup_distributed(30.0) == (1, 2, torch.device("cpu"))
    assert calls == [("gloo", None)]                            # no set_device(cuda:1), no nccl
    assert capsys.readouterr().out == ""                        # rank 1 says nothing
    calls = _fake_machine(monkeypatch, gpus=1, rank=0)
    assert train_script.setup_distributed(30.0) == (0, 2, torch.device("cpu"))
    assert "1 CUDA device(s): nccl needs a GPU for each process" in capsys.readouterr().out


def test_setup_distributed_gives_each_process_its_gpu_and_honours_ptlab_device(monkeypatch, capsys):
    calls = _fake_machine(monkeypatch, gpus=2, rank=1)
    assert train_script.setup_distributed(30.0) == (1, 2, torch.device("cuda", 1))
    assert calls == [("set_device", torch.device("cuda", 1)), ("nccl", torch.device("cuda", 1))]
    calls = _fake_machine(monkeypatch, gpus=2, rank=1, PTLAB_DEVICE="cpu")    # what the chapter and the tests do
    assert train_script.setup_distributed(30.0) == (1, 2, torch.device("cpu")) and calls == [("gloo", None)]
    calls = _fake_machine(monkeypatch, mps=True, rank=0)                      # a Mac
    assert train_script.setup_distributed(30.0) == (0, 2, torch.device("cpu")) and calls == [("gloo", None)]
    assert "no backend for Apple's MPS" in capsys.readouterr().out


def test_python_m_ptlab_train_forwards_to_the_script(tmp_path, capsys):
    from ptlab.__main__ import main as cli

    with pytest.raises(SystemExit) as exit_info:
        cli(["train", "--help"])
    assert exit_info.value.code == 0 and "usage: python -m ptlab train" in capsys.readouterr().out
    assert os.environ.get("RANK") is None


def _final_weights(folder):
    return torch.load(folder / "checkpoints" / "last.pt", weights_only=True)["model"]


def test_resume_is_bit_exact_one_plus_one_equals_two(tmp_path, monkeypatch):
    """`--epochs 1` then `--resume --epochs 2` ends with the very weights of `--epochs 2` straight through."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PTLAB_DEVICE", "cpu")                   # the same run, and AMP off, on a GPU machine too
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    for folder in (straight, resumed):
        folder.mkdir()
    monkeypatch.chdir(straight)
    assert main([*SMALL, "--epochs", "2"]) == 0
    monkeypatch.chdir(resumed)
    assert main([*SMALL, "--epochs", "1"]) == 0
    assert main([*SMALL, "--resume", "--epochs", "2"]) == 0
    a, b = _final_weights(straight), _final_weights(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "resumed weights differ from the straight run's"


@pytest.mark.parametrize("argv, message", [
    (["--lr", "-0.1"], "--lr must be a positive number, got -0.1"),
    (["--val-fraction", "1.5"], "--val-fraction must be between 0 and 1"),
    (["--workers", "-1"], "--workers must be 0 (load in the main process) or more, got -1"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds"),
])
def test_bad_values_are_usage_errors_not_tracebacks(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_a_global_batch_that_does_not_divide_by_the_ranks_is_refused(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(SystemExit) as exit_info:
        main(["--batch-size", "32"])
    assert exit_info.value.code == 2
    assert "--batch-size 32 does not divide by the world size 3" in capsys.readouterr().err


def test_resume_with_another_width_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(SMALL) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*SMALL[:-4], "--width", "16", "--batch-size", "32", "--resume", "--epochs", "2"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    assert "--resume: checkpoints/last.pt holds another model than --width 16 builds" in err


def test_resuming_a_finished_run_trains_and_logs_nothing(tmp_path, monkeypatch, capsys):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert main([*SMALL, "--epochs", "2"]) == 0
    [run] = read_runs(tmp_path)
    best = run["curves"]["epoch"].index(run["metrics"]["best_epoch"])
    assert run["metrics"]["val_acc"] == run["curves"]["val_acc"][best] == max(run["curves"]["val_acc"])
    assert f"with the weights of epoch {run['metrics']['best_epoch']}" in capsys.readouterr().out
    assert main([*SMALL, "--resume", "--epochs", "2"]) == 0
    assert "already has 2 epochs (--epochs 2): nothing to train, nothing logged" in capsys.readouterr().out
    assert len(read_runs(tmp_path)) == 1


def test_the_logged_train_curves_are_the_mean_over_ranks():
    import rank_workers

    from ptlab.distributed import run_ranks

    run = run_ranks(rank_workers.averaged_train_curves, 2, timeout_s=120)
    assert run.ok, run.error
    assert run.results == [[1.5, 3.5, 0.5, 0.125]] * 2          # before: rank 0 logged its own [1.0, 2.0, ...]


NCCL_AVERAGE = """
import sys
import torch
import torch.distributed as dist
from ptlab.train import History
from ptlab.train_script import _average_over_ranks

gpu = torch.device("cuda", 0)
torch.cuda.set_device(gpu)
dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0, world_size=1, device_id=gpu)
history = History(epoch=[1, 2], train_loss=[2.0, 1.0], train_acc=[0.25, 0.5])
_average_over_ranks(history, ("train_loss", "train_acc"), 1, gpu)
dist.destroy_process_group()
print(history.train_loss, history.train_acc)
"""


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and nccl")
def test_the_logged_curves_average_in_a_real_nccl_group():
    """The curves' all-reduce at the end of a multi-GPU run, on real nccl (a one-rank group refused the CPU tensor
    on an H200): the call with the rank's GPU."""
    import subprocess
    import sys

    from ptlab.core import env_importing_this_ptlab
    from ptlab.distributed import free_port

    done = subprocess.run([sys.executable, "-c", NCCL_AVERAGE, str(free_port())], capture_output=True, text=True,
                          timeout=120, env=env_importing_this_ptlab())
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[2.0, 1.0] [0.25, 0.5]"
