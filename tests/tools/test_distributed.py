"""ptlab.distributed: real ranks on gloo, started with a timeout, their results gathered in rank order."""
import multiprocessing
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
import rank_workers
from notebook_rules import ROOT

from ptlab import distributed as d
from ptlab.course import notebook_text
from ptlab.distributed import run_ranks
from ptlab.lessons.ch07_ddp import rank_functions as rf
from ptlab.lessons.ch07_ddp import scaling


def test_free_port_can_be_bound():
    port = d.free_port()
    assert isinstance(port, int) and 0 < port < 65536
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_two_ranks_report_in_rank_order():
    run = run_ranks(rf.describe_rank, 2, timeout_s=120)
    assert run.ok and run.error is None and run.failed_rank is None
    assert [r["rank"] for r in run.results] == [0, 1]
    assert all(r["world_size"] == 2 and r["backend"] == "gloo" and r["threads"] == 1 for r in run.results)


def test_ddp_keeps_parameters_identical_and_plain_training_does_not():
    with_ddp = run_ranks(rf.train_and_gather_checksums, steps=5, timeout_s=120)
    alone = run_ranks(rf.train_and_gather_checksums, steps=5, wrap=False, timeout_s=120)
    assert with_ddp.results[0] == with_ddp.results[1]              # every rank gathered every rank's checksum
    assert len({digest for _, digest in with_ddp.results[0]}) == 1
    assert len({digest for _, digest in alone.results[0]}) == 2


def test_sampler_pads_by_default_and_trims_with_drop_last():
    shards = run_ranks(rf.sampler_shards, n=11, timeout_s=120).results
    assert [s["padded"][0] for s in shards] == [[0, 2, 4, 6, 8, 10], [1, 3, 5, 7, 9, 0]]
    assert [s["drop_last"][0] for s in shards] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    shuffled = run_ranks(rf.sampler_shards, n=12, shuffle=True, epochs=2, timeout_s=120).results
    for epoch in range(2):
        parts = [s["padded"][epoch] for s in shuffled]
        assert sorted(parts[0] + parts[1]) == list(range(12))       # disjoint and complete
    assert shuffled[0]["padded"][0] != shuffled[0]["padded"][1]     # set_epoch reshuffles


def test_half_batches_on_two_ranks_equal_one_process_without_batchnorm():
    plain = run_ranks(rf.split_batch_vs_one_process, global_batch=16, steps=3, timeout_s=120).results
    with_bn = run_ranks(rf.split_batch_vs_one_process, global_batch=16, steps=3, batchnorm=True, timeout_s=120).results
    assert plain[1] is None and plain[0] < 1e-5
    assert with_bn[0] > 1e-3


def test_rank_zero_saves_plain_keys_and_the_others_read_after_the_barrier(tmp_path):
    run = run_ranks(rf.save_on_rank_zero, folder=str(tmp_path), timeout_s=120)
    assert run.ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "train.log"]
    assert (tmp_path / "train.log").read_text().splitlines() == ["saved model.pt"]
    assert all(r["loaded equals my weights"] and r["first key"] == "0.weight" for r in run.results)


def test_a_failing_rank_ends_the_job_with_its_error_before_the_collective_timeout():
    run = run_ranks(rf.fail_on_rank, fail_rank=1, fail_at_step=2, collective_timeout_s=60.0, timeout_s=120)
    assert not run.ok and not run.timed_out
    assert run.failed_rank == 1 and run.error == "ValueError: rank 1: corrupt batch at step 2"
    assert run.seconds < 30, f"the job waited {run.seconds:.1f} s: it should end when rank 1 fails, not time out"


def test_a_rank_that_never_arrives_is_stopped_at_the_timeout():
    run = run_ranks(rf.extra_forward_on_rank_zero, batchnorm=True, collective_timeout_s=600.0, timeout_s=6.0)
    assert run.timed_out and run.error == "timed out" and run.results == [None, None]
    assert 6.0 <= run.seconds < 30


def test_an_extra_forward_on_one_rank_survives_hangs_or_aborts_depending_on_where_it_falls():
    # No buffers, after every step: rank 0's extra forward carries DDP's one-time bucket broadcast, and rank 1's
    # next forward carries its own: they pair by coincidence.
    paired = run_ranks(rf.extra_forward_on_rank_zero, batchnorm=False, collective_timeout_s=5.0, timeout_s=120)
    assert paired.ok and paired.results == [4, 4]
    # No buffers, after the only step: rank 1 has no next forward, so the broadcast is never matched.
    alone = run_ranks(rf.extra_forward_on_rank_zero, batchnorm=False, steps=1, collective_timeout_s=2.0,
                      timeout_s=120)
    assert not alone.ok and not alone.timed_out
    assert any("Timed out waiting 2000ms" in line for line in alone.errors.values()), alone.errors
    # BatchNorm, no_grad, after every step: rank 0's buffers (256 bytes) meet rank 1's bucket order (28 bytes).
    aborted = run_ranks(rf.extra_forward_on_rank_zero, batchnorm=True, grad=False, collective_timeout_s=5.0,
                        timeout_s=120)
    assert aborted.failed_rank == 1 and aborted.errors[1] == "exited with code -6"
    assert "256 vs 28" in aborted.outputs[1] and "collective mismatch" in aborted.outputs[1]
    # The same no_grad forward after step 1 only takes the place of rank 0's next buffer broadcast: it survives.
    survived = run_ranks(rf.extra_forward_on_rank_zero, batchnorm=True, grad=False, after=(1,),
                         collective_timeout_s=5.0, timeout_s=120)
    assert survived.ok and survived.results == [4, 4]


def test_a_mean_over_padded_shards_counts_the_padding_and_plain_slices_do_not():
    results = run_ranks(rf.mean_over_ranks, n=11, timeout_s=120).results
    assert results[0] == results[1] == {"padded": 55 / 12, "exact": 5.0}


@pytest.mark.parametrize("platform, methods, expected", [
    ("linux", ["fork", "spawn", "forkserver"], "forkserver"),
    ("linux", ["fork", "spawn"], "spawn"),
    ("darwin", ["spawn", "fork", "forkserver"], "spawn"),
    ("win32", ["spawn"], "spawn"),
])
def test_the_default_start_method_is_chosen_per_platform(monkeypatch, platform, methods, expected):
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: methods)
    assert d.default_start_method(platform) == expected


def test_on_windows_run_ranks_starts_with_spawn_and_refuses_forkserver_clearly(monkeypatch):
    monkeypatch.setattr(sys, "platform", "win32")
    monkeypatch.setattr(multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    started = []

    def launch(fn, kwargs, world_size, threads, collective_timeout_s, timeout_s, start_method):
        started.append(start_method)
        return d.RankRun(world_size, list(range(world_size)), [""] * world_size, 0.0)

    monkeypatch.setattr(d, "_launch", launch)
    assert run_ranks(rf.describe_rank).ok and started == ["spawn"]
    with pytest.raises(ValueError, match=r"'forkserver' does not exist on this platform \(win32\): use 'spawn'"):
        run_ranks(rf.describe_rank, start_method="forkserver")
    with pytest.raises(ValueError, match="cannot be imported by name"):     # importability is checked first
        run_ranks(lambda: 1, start_method="forkserver")
    assert started == ["spawn"]


def test_run_ranks_rejects_bad_arguments():
    def local():
        return 1

    with pytest.raises(ValueError, match="cannot be imported by name"):
        run_ranks(local)
    with pytest.raises(ValueError, match="world_size"):
        run_ranks(rf.describe_rank, 0)
    with pytest.raises(ValueError, match="start_method"):
        run_ranks(rf.describe_rank, start_method="fork")
    with pytest.raises(ValueError, match="timeout_s"):
        run_ranks(rf.describe_rank, timeout_s=0)
    with pytest.raises(TypeError, match="function"):
        run_ranks("describe_rank")


@pytest.mark.slow
def test_spawn_cannot_start_a_function_of_an_interactive_main_but_can_from_a_script(tmp_path):
    code = textwrap.dedent("""
        from ptlab.distributed import run_ranks

        def defined_in_main():
            return 1

        if __name__ == "__main__":
            run = run_ranks(defined_in_main, 1, start_method="spawn", timeout_s=120)
            print(run.failed_rank, run.error, run.results)
    """)
    env = {**__import__("os").environ, "PYTHONPATH": str(ROOT)}
    # `python -c` is like a notebook: its __main__ has no file, so the child cannot import the function
    interactive = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                                 cwd=tmp_path, env=env)
    assert interactive.returncode == 0, interactive.stderr
    assert interactive.stdout.startswith("0 AttributeError: Can't get attribute 'defined_in_main'"), interactive.stdout
    # a script's __main__ is a file: spawn runs it again as __mp_main__ (the guard skips the launch), and it works
    (tmp_path / "main_fn.py").write_text(code)
    script = subprocess.run([sys.executable, "main_fn.py"], capture_output=True, text=True, timeout=300,
                            cwd=tmp_path, env=env)
    assert script.returncode == 0 and script.stdout == "None None [1]\n", script.stdout + script.stderr


def test_clean_error_removes_machine_specific_parts():
    raw = ("RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:561] "
           "Connection closed by peer [127.0.0.1]:46274.")
    assert d.clean_error(raw) == "RuntimeError: Connection closed by peer [127.0.0.1]:PORT."
    assert d.clean_error("AttributeError: x on <module '__mp_main__' from '/a/b/c.py'>") == \
        "AttributeError: x on <module '__mp_main__'>"
    assert d.last_error_line("Traceback\n  File x\n[rank1]: ValueError: bad\n") == "ValueError: bad"
    assert d.last_error_line("all good\n") is None


def test_commands_and_masking():
    command = d.torchrun_command(["-m", "ptlab", "train"], 2)
    text = notebook_text.shown_command(command)
    assert text.startswith("python -m torch.distributed.run --nnodes=1 --nproc-per-node=2 --rdzv-backend=c10d "
                           "--rdzv-endpoint=127.0.0.1:PORT -m ptlab train")
    multi = d.multinode_command(nnodes=2, nproc=8, endpoint="node0:29500")
    for part in ("--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=node0:29500"):
        assert part in multi
    assert "--node-rank" not in multi          # c10d numbers the machines itself: one line for every machine
    assert notebook_text.shown_command(command, env={"PTLAB_DEVICE": "cpu"}).startswith(
        "PTLAB_DEVICE=cpu python -m torch.distributed.run --nnodes=1")
    assert notebook_text.mask_figures("loss 2.4461, epoch 1, acc 0.1250") == "loss ≈2.4461, epoch 1, acc ≈0.1250"
    with pytest.raises(ValueError):
        d.torchrun_command(["x.py"], 0)


def test_scaling_estimate_follows_the_ring_formula():
    result = scaling.ScalingResult(one={"step": 1.0, "step cpu all": 1.0},
                                   many={"step": 0.5, "step cpu all": 1.2, "compute": 0.4, "allreduce": 0.1},
                                   world_size=2, global_batch=64)
    assert result.speedup == pytest.approx(2.0) and result.cpu_ratio == pytest.approx(1.2)
    assert result.estimate(1) == pytest.approx(1.0)
    assert result.estimate(2) == pytest.approx(0.8 / (0.4 + 0.1))
    assert result.estimate(4) == pytest.approx(0.8 / (0.2 + 0.1 * 1.5))
    with pytest.raises(ValueError):
        result.estimate(0)


def test_measure_scaling_times_both_sides():
    result = scaling.measure_scaling(world_size=2, global_batch=16, steps=1, rounds=1)
    for side in (result.one, result.many):
        assert {"step", "step cpu", "step cpu all", "compute", "allreduce", "gradient MB"} <= set(side)
        assert side["step"] > 0
    assert result.one["step cpu all"] == result.one["step cpu"]          # one process: its own CPU time
    assert result.many["step cpu all"] > result.many["step cpu"]         # both ranks' CPU time, not rank 0's twice
    assert result.cpu_ratio > 0.5 and result.estimate(8) > 1


def test_a_rank_killed_by_sigkill_is_a_failure_with_the_signal_named():
    run = run_ranks(rank_workers.killed_on_rank, rank=1, timeout_s=120)
    assert not run.ok and not run.timed_out and run.failed_rank == 1
    assert run.error == "killed by signal 9 (SIGKILL): often the out-of-memory killer"


def test_a_return_value_that_cannot_be_pickled_is_named_with_its_type_and_error():
    run = run_ranks(rank_workers.unpicklable_on_rank, rank=1, timeout_s=120)
    assert not run.ok and run.failed_rank == 1 and list(run.errors) == [1]
    assert run.error == ("the return value of rank 1 could not be pickled (_thread.lock): "
                         "TypeError: cannot pickle '_thread.lock' object")


def test_a_reader_never_sees_part_of_an_error_file_while_a_rank_writes_it(tmp_path):
    import json
    import threading

    message = "RuntimeError: " + "x" * 200_000            # a long line: writing it takes more than one moment
    path, partial, reads = tmp_path / "rank0.error", [], 0

    def write() -> None:
        for _ in range(30):
            d._write_error(str(tmp_path), 0, message)

    writer = threading.Thread(target=write)
    writer.start()
    while writer.is_alive():
        if path.exists():
            text = path.read_text()
            reads += 1
            try:
                json.loads(text)
            except ValueError:
                partial.append(len(text))
    writer.join()
    assert reads > 0 and not partial, f"{len(partial)} of {reads} reads saw a partial file"
    assert d._read_error(path)[1] == message
    assert d._read_error(tmp_path / "rank1.error") is None
    (tmp_path / "cut.error").write_text('{"time": 1.0, "li')      # cut short: no error line, no crash
    assert d._read_error(tmp_path / "cut.error") is None


def test_collective_device_is_the_ranks_gpu_under_nccl_and_the_cpu_under_gloo():
    from ptlab.distributed import collective_device

    assert collective_device("nccl", torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert collective_device("gloo", "cuda:0") == torch.device("cpu")
    assert collective_device("gloo", "cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="nccl reduces only tensors on the rank's GPU"):
        collective_device("nccl", "cpu")
    with pytest.raises(ValueError, match="backend must be 'nccl' or 'gloo', got 'mpi'"):
        collective_device("mpi", "cpu")
