"""Every tool that takes a model and data works with the model on a second device and the data on the CPU.

CI has no GPU, so the second device is simulated: `SecondDevice` (a TorchDispatchMode) turns every
`.to("meta")` into an `OnSecondDevice` tensor, which reports `device='meta'` but holds real values on
the CPU. Each op on such tensors runs on the CPU on their values, after the check CUDA makes: an op
that mixes a tensor on the second device with a CPU tensor of one or more dimensions raises
`DeviceMixed` ("Expected all tensors to be on the same device"). As on CUDA, a 0-dim CPU tensor
(a scalar), cross-device `copy_` and CPU index tensors are accepted. So a tool that forgets to move a
batch (inputs or labels) to the model's device fails here as it would on a GPU, and one that moves
it computes the very numbers it computes on the CPU, which each test compares.

What this cannot catch: code that runs only when `device.type == "cuda"` (pinned memory, CUDA
synchronisation, float16 autocast and GradScaler: the simulated device is 'meta'), numerical
differences of GPU kernels, GPU memory, an op for which real CUDA is stricter or looser than the rule
above, and `torch.save` on the second device (its tensors are written as CPU tensors, so a reloaded
checkpoint is on the CPU here and on the GPU on a GPU machine).
"""
from __future__ import annotations

import ast
import copy
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[2]
SECOND = torch.device("meta")
CPU = torch.device("cpu")
# Ops CUDA runs with CPU tensors among the arguments: a copy across devices, CPU index tensors.
CROSS_DEVICE_OK = {torch.ops.aten.copy_.default, torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default,
                   torch.ops.aten.index_put.default, torch.ops.aten._index_put_impl_.default}


class DeviceMixed(RuntimeError):
    """An op got tensors on the second device and on the CPU: on a GPU this op raises too."""


def _on_second(device) -> bool:
    if device is None:
        return False
    return (device.type if isinstance(device, torch.device) else torch.device(device).type) == SECOND.type


class OnSecondDevice(torch.Tensor):
    """A tensor that says it is on the second device ('meta') and computes on the CPU with real values."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, elem.shape, strides=elem.stride(), storage_offset=elem.storage_offset(), dtype=elem.dtype,
            layout=elem.layout, device=SECOND, requires_grad=False)
        wrapper.elem = elem
        return wrapper

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self) -> str:
        return f"OnSecondDevice({self.elem!r})"

    def untyped_storage(self):                      # memory accounting reads the storage under a tensor
        return self.elem.untyped_storage()

    def data_ptr(self) -> int:
        return self.elem.data_ptr()

    def __reduce_ex__(self, protocol):              # torch.save writes the values, as a CPU tensor
        return self.elem.__reduce_ex__(protocol)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        _check_devices(func, args, kwargs)
        target = kwargs.get("device")
        out = func(*[_unwrap(a) for a in args], **{k: _unwrap(v) for k, v in _on_cpu(kwargs).items()})
        if target is not None and not _on_second(target):
            return out                              # e.g. .cpu(): a plain CPU tensor
        return _returned(func, args, kwargs, _wrap(out))


# The code below runs for every op, so no pytree: an op's arguments are tensors, lists or tuples of
# tensors, or other values.
def _unwrap(t):
    if isinstance(t, OnSecondDevice):
        return t.elem
    if isinstance(t, (list, tuple)) and any(isinstance(x, OnSecondDevice) for x in t):
        return type(t)(x.elem if isinstance(x, OnSecondDevice) else x for x in t)
    return t


def _wrap(out):
    if isinstance(out, torch.Tensor):
        return out if isinstance(out, OnSecondDevice) else OnSecondDevice(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(x) for x in out)
    return out


def _tensors(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _on_cpu(kwargs: dict) -> dict:
    """kwargs with a device= of the second device turned into the CPU, where the values live."""
    return {**kwargs, "device": CPU} if _on_second(kwargs.get("device")) else kwargs


def _check_devices(func, args, kwargs) -> None:
    others = [t for t in _tensors(args, kwargs) if not isinstance(t, OnSecondDevice)]
    if not others:
        return
    if any(t.device.type == SECOND.type for t in others):
        raise DeviceMixed(f"{func}: a real meta tensor (no values) among tensors on the simulated second device")
    cpu = [t for t in others if t.dim() > 0]
    if cpu and func not in CROSS_DEVICE_OK:
        raise DeviceMixed(f"Expected all tensors to be on the same device, but found at least two devices, "
                          f"{SECOND} and cpu! ({func} got a CPU tensor of shape {tuple(cpu[0].shape)}; "
                          f"{SECOND} simulates a GPU)")


_WRITES: dict = {}


def _writes(func) -> tuple[dict, list]:
    """For an op: {alias set: (index, name)} of the arguments it writes, and the alias set each return writes."""
    if func not in _WRITES:
        schema = func._schema
        args = {frozenset(a.alias_info.before_set): (i, a.name) for i, a in enumerate(schema.arguments)
                if a.alias_info is not None and a.alias_info.is_write}
        rets = [frozenset(r.alias_info.before_set) if r.alias_info is not None and r.alias_info.is_write else None
                for r in schema.returns]
        _WRITES[func] = (args, rets)
    return _WRITES[func]


def _returned(func, args, kwargs, out):
    """An in-place or out= op returns the very tensor it wrote to, as autograd expects."""
    written, rets = _writes(func)
    if not written:
        return out
    results = list(out) if isinstance(out, (tuple, list)) else [out]
    for i, alias in enumerate(rets):
        if alias in written:
            index, name = written[alias]
            results[i] = args[index] if index < len(args) else kwargs.get(name, results[i])
    return type(out)(results) if isinstance(out, (tuple, list)) else results[0]


class SecondDevice(TorchDispatchMode):
    """While active, `.to("meta")` and factories with device="meta" make OnSecondDevice tensors.

    `copies` records, for every copy onto the second device, whether it was non_blocking.
    """

    def __init__(self) -> None:
        super().__init__()
        self.copies: list[bool] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _on_second(kwargs.get("device")) and not any(isinstance(t, OnSecondDevice) for t in _tensors(args, kwargs)):
            if func is torch.ops.aten._to_copy.default:
                self.copies.append(bool(kwargs.get("non_blocking", False)))
            return _wrap(func(*args, **_on_cpu(kwargs)))
        return func(*args, **kwargs)


def on_second_device(module: nn.Module) -> tuple[nn.Module, list[torch.device]]:
    """The module moved to the second device, and a list that records the device of each input it is called on."""
    seen: list[torch.device] = []
    module.register_forward_pre_hook(lambda m, inputs: seen.extend(t.device for t in inputs
                                                                    if isinstance(t, torch.Tensor)))
    return module.to(SECOND), seen


# ---------------------------------------------------------------- the simulation itself


def test_the_simulated_device_catches_a_model_on_it_called_on_a_cpu_batch():
    """Chapter 4's crash on a GPU, reproduced without one: model.to(device), then model(cpu_batch)."""
    torch.manual_seed(0)
    X = torch.randn(8, 4)
    cpu_model = nn.Sequential(nn.Linear(4, 3))
    expected = cpu_model(X)
    with SecondDevice():
        model, _ = on_second_device(copy.deepcopy(cpu_model))
        with pytest.raises(DeviceMixed, match="same device"), torch.no_grad():
            model(X)
        out = model(X.to(SECOND))
        assert out.device == SECOND and torch.equal(out.cpu(), expected)
        assert (out.sum() * torch.tensor(2.0)).device == SECOND      # a CPU scalar is fine, as on CUDA
        with pytest.raises(DeviceMixed):
            nn.functional.cross_entropy(out, torch.zeros(8, dtype=torch.long))   # labels left on the CPU
        with pytest.raises(DeviceMixed):
            torch.equal(model[0].weight, cpu_model[0].weight)                   # compared across devices


def test_the_simulated_device_trains_exactly_as_the_cpu():
    torch.manual_seed(0)
    X, y = torch.randn(16, 4), torch.randint(0, 3, (16,))
    cpu_model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))
    twin = copy.deepcopy(cpu_model)
    for model, device in ((cpu_model, CPU), (twin, SECOND)):
        with SecondDevice():
            model.to(device)
            opt = torch.optim.AdamW(model.parameters(), lr=0.1)
            for _ in range(3):
                loss = nn.functional.cross_entropy(model(X.to(device)), y.to(device))
                opt.zero_grad()
                loss.backward()
                opt.step()
    assert all(isinstance(t, OnSecondDevice) for t in twin.state_dict().values())
    assert all(torch.equal(a, b.cpu()) for a, b in zip(cpu_model.state_dict().values(), twin.state_dict().values()))


# ---------------------------------------------------------------- the tools


def _data(n: int = 96, features: int = 6, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % classes
    X = torch.randn(n, features, generator=g) + 2 * nn.functional.one_hot(y, features).float()
    return X, y


def _loader(shuffle: bool = False, batch_size: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(*_data()), batch_size=batch_size, shuffle=shuffle,
                      generator=torch.Generator().manual_seed(0))


def _model(features: int = 6, classes: int = 3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, classes))


def _both(run):
    """run(model) on the CPU and on the second device (the batches stay on the CPU); both results and the
    devices the second-device model's forward passes got."""
    on_cpu = run(_model())
    with SecondDevice():
        model, seen = on_second_device(_model())
        on_second = run(model)
    assert seen, "the model was never called"
    assert set(seen) == {SECOND}, f"the model on {SECOND} was called on inputs on {set(seen)}"
    return on_cpu, on_second, model


def _cpu_state(model: nn.Module) -> list[torch.Tensor]:
    return [t.cpu() for t in model.state_dict().values()]


def test_train_one_epoch_and_evaluate_move_inputs_and_labels_to_the_model():
    from ptlab.train import evaluate, train_one_epoch

    def run(model):
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        train = train_one_epoch(model, _loader(shuffle=True), opt)
        return {k: v for k, v in train.items() if k != "seconds"}, evaluate(model, _loader()), _cpu_state(model)

    on_cpu, on_second, _ = _both(run)
    assert on_cpu[:2] == on_second[:2]
    assert all(torch.equal(a, b) for a, b in zip(on_cpu[2], on_second[2]))


def test_fit_trains_a_model_on_the_second_device_as_on_the_cpu():
    from ptlab.train import fit

    def run(model):
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=2 * 6)
        history = fit(model, _loader(shuffle=True), _loader(), opt, epochs=2, scheduler=sched,
                      scheduler_step="batch", progress=False)
        return {k: v for k, v in history.as_dict().items() if k != "seconds"}

    on_cpu, on_second, _ = _both(run)
    assert on_cpu == on_second and len(on_cpu["epoch"]) == 2


def test_predict_and_confusion_matrix_take_the_model_device_and_give_cpu_results():
    from ptlab.results import confusion_matrix, predict

    (pred, true), (pred_2, true_2), _ = _both(lambda model: predict(model, _loader()))
    assert pred_2.device == true_2.device == CPU
    assert torch.equal(pred, pred_2) and torch.equal(true, true_2)
    matrix = confusion_matrix(pred, true, 3)
    with SecondDevice():
        mixed = confusion_matrix(pred.to(SECOND), true, 3)          # predictions on the GPU, labels not
    assert mixed.device == CPU and torch.equal(mixed, matrix) and int(matrix.sum()) == len(true)


def test_overfit_one_batch_moves_the_batch_and_reports_the_same_causes():
    from ptlab.overfit import overfit_one_batch

    batch = tuple(t[:24] for t in _data())

    def run(model):
        passed = overfit_one_batch(model, batch, steps=60, lr=0.05)
        model[0].requires_grad_(False)
        failed = overfit_one_batch(model, (batch[0][:1].expand(24, -1), batch[1]), steps=10,
                                   raise_on_failure=False)
        return passed.losses, failed.losses, failed.causes

    on_cpu, on_second, _ = _both(run)
    assert on_cpu == on_second
    assert "frozen parameters" in on_cpu[2] and "labels do not match inputs" in on_cpu[2]


def test_first_nonfinite_moves_the_input_to_the_model():
    from ptlab.clinic import first_nonfinite

    class LogOfNegative(nn.Module):
        def forward(self, x):
            return torch.log(x - 100)

    def run(model):
        broken = nn.Sequential(model, LogOfNegative())
        return first_nonfinite(model, _data()[0][:8]), first_nonfinite(broken, _data()[0][:8])

    on_cpu, on_second, _ = _both(run)
    assert on_cpu == on_second and on_cpu[0] is None and on_cpu[1].where == "1"


def test_lr_range_test_moves_each_batch_and_gives_the_cpu_curve():
    from ptlab.clinic import lr_range_test

    def run(model):
        result = lr_range_test(model, _loader(shuffle=True), lambda p: torch.optim.SGD(p, lr=0.0),
                               start_lr=1e-3, end_lr=10.0, steps=12)
        return result.lrs, result.losses

    on_cpu, on_second, _ = _both(run)
    assert on_cpu == on_second and len(on_cpu[0]) >= 2


def test_profile_training_moves_each_batch():
    from ptlab.profiling import profile_training

    def run(model):
        profile_training(model, _loader(), torch.optim.SGD(model.parameters(), lr=0.1), steps=2)
        return _cpu_state(model)

    on_cpu, on_second, _ = _both(run)
    assert all(torch.equal(a, b) for a, b in zip(on_cpu, on_second))


def test_pinned_batches_are_copied_non_blocking_the_others_not(monkeypatch):
    from ptlab.loop import unpack_batch

    X, y = _data()
    with SecondDevice() as mode:
        unpack_batch((X, y), SECOND)
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda self, *a: True)  # pinning needs an accelerator
        moved = unpack_batch((X, y), SECOND)
    assert mode.copies == [False, False, True, True]
    assert [t.device for t in moved] == [SECOND, SECOND] and torch.equal(moved[1].cpu(), y)


def test_memory_breakdown_moves_the_batch_to_the_model():
    from ptlab.memory import memory_breakdown

    def run(model):
        parts = memory_breakdown(model, torch.optim.AdamW(model.parameters()), tuple(t[:16].clone() for t in _data()))
        return parts.parameters, parts.gradients, parts.optimizer_state, parts.activations, parts.batch

    on_cpu, on_second, _ = _both(run)
    assert on_cpu == on_second


def test_diagnose_gradients_moves_the_batch_to_the_model():
    from ptlab.diagnose import diagnose_gradients

    def run(model):
        return str(diagnose_gradients(model, batch=tuple(t[:16] for t in _data()),
                                      loss_fn=nn.functional.cross_entropy))

    on_cpu, on_second, _ = _both(run)
    assert on_cpu == on_second


def test_reference_accuracy_on_moves_the_images_to_the_model():
    from ptlab.models import SmallCNN
    from ptlab.reference import accuracy_on

    images, labels = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8), torch.arange(8) % 10
    torch.manual_seed(0)
    expected = accuracy_on(SmallCNN(width=4), images, labels)
    with SecondDevice():
        torch.manual_seed(0)
        model, _ = on_second_device(SmallCNN(width=4))
        assert accuracy_on(model, images, labels) == expected


def test_flop_counts_take_a_model_on_the_second_device():
    """ptlab.amp's FLOP counters make their own probe batch: it goes where the model is."""
    from ptlab.amp import forward_flops, training_step_flops

    on_cpu = (forward_flops(_model(), (6,)), training_step_flops(_model(), (6,)))
    with SecondDevice():
        model, seen = on_second_device(_model())
        on_second = (forward_flops(model, (6,)), training_step_flops(model, (6,)))
    assert on_second == on_cpu and on_cpu[0] > 0


def test_load_checkpoint_reads_the_file_onto_the_cpu_for_a_model_on_another_device(monkeypatch, tmp_path):
    """A run written on a GPU resumes on any machine: the file is mapped to the CPU, not to the model's device."""
    import ptlab.checkpoint as checkpoint

    seen, real_load = [], torch.load

    def recording_load(*args, **kwargs):
        seen.append(kwargs.get("map_location"))
        return real_load(*args, **kwargs)

    checkpoint.save_checkpoint(tmp_path / "ck.pt", _model(), epoch=0)
    monkeypatch.setattr(checkpoint.torch, "load", recording_load)
    with SecondDevice():
        model, _ = on_second_device(_model())
        checkpoint.load_checkpoint(tmp_path / "ck.pt", model, generators={})
    assert seen == ["cpu"]


def test_the_reference_script_resumes_a_model_on_the_second_device(monkeypatch, tmp_path):
    """`ptlab-train --resume` with the model on a GPU (H200, first run: it crashed in load_checkpoint, which had
    mapped the file to the GPU, generator states included, and set_state takes only a CPU ByteTensor).
    Here the resume and the final evaluation run with the model on the simulated second device, and end
    with the very weights a resume on the CPU gives."""
    import ptlab.train_script as train_script

    small = ["--dry-run", "--width", "8", "--batch-size", "32"]
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PTLAB_DEVICE", "cpu")
    weights = {}
    for where in ("cpu", "second"):
        (tmp_path / where).mkdir()
        monkeypatch.chdir(tmp_path / where)
        assert train_script.main([*small, "--epochs", "1"]) == 0               # written on the CPU
        if where == "second":
            monkeypatch.setattr(train_script, "setup_distributed", lambda timeout_s: (0, 1, SECOND))
            with SecondDevice():
                assert train_script.main([*small, "--resume", "--epochs", "2"]) == 0
        else:
            assert train_script.main([*small, "--resume", "--epochs", "2"]) == 0
        weights[where] = torch.load(tmp_path / where / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert weights["cpu"].keys() == weights["second"].keys()
    assert all(torch.equal(weights["cpu"][k], weights["second"][k]) for k in weights["cpu"])


def test_the_logged_curves_are_averaged_on_the_ranks_gpu_under_nccl(monkeypatch):
    """The reference script's multi-GPU runs all-reduced a CPU tensor in an nccl group at their end (chapter 7's
    review; on an H200 a one-rank nccl group refused it: "No backend type associated with device type cpu").
    Here the group says nccl, and an all_reduce that, like nccl, refuses any tensor not on the rank's device
    (the simulated second device stands for its GPU) sums a world of one."""
    import ptlab.train_script as train_script
    from ptlab.train import History

    def nccl_all_reduce(tensor, *args, **kwargs):
        if tensor.device != SECOND:
            raise RuntimeError(f"No backend type associated with device type {tensor.device.type}")

    monkeypatch.setattr(train_script.dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(train_script.dist, "all_reduce", nccl_all_reduce)
    history = History(epoch=[1, 2], train_loss=[1.5, 0.5], train_acc=[0.25, 0.75])
    with SecondDevice():
        train_script._average_over_ranks(history, ("train_loss", "train_acc"), 1, SECOND)
    assert (history.train_loss, history.train_acc) == ([1.5, 0.5], [0.25, 0.75])


def test_a_random_state_on_another_device_is_refused_by_torch():
    """Why the checkpoint is mapped to the CPU: torch takes a generator's state only as a CPU tensor."""
    state = torch.get_rng_state()
    with pytest.raises((RuntimeError, TypeError)):
        torch.set_rng_state(state.to("meta"))
    assert torch.equal(torch.get_rng_state(), state)


def test_nothing_calls_cuda_unconditionally():
    """No `.cuda()` in ptlab or in a notebook: code moves tensors with .to(device), which works on every machine."""
    sources = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in (ROOT / "ptlab").rglob("*.py")}
    for path in sorted((ROOT / "notebooks").rglob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                lines = cell.source.splitlines()
                sources[f"{path.relative_to(ROOT)} c{i}"] = "\n".join(
                    "" if line.lstrip().startswith(("%", "!")) else line for line in lines)
    calls = [where for where, code in sources.items() for node in ast.walk(ast.parse(code))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "cuda"]
    assert calls == []
