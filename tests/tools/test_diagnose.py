"""The gradient-flow detector: each cause on a small model, a healthy model, and bad input."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ptlab.diagnose import SavedTensors, diagnose_gradients, saved_tensor_bytes, unregistered_parameters

X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))   # (B, F)
Y = X.sum(dim=1, keepdim=True)                                       # (B, 1)


class TwoStage(nn.Module):
    """encoder -> (something) -> head; `how` picks the something."""

    def __init__(self, how: str = "none"):
        super().__init__()
        self.encoder, self.head, self.how = nn.Linear(4, 4), nn.Linear(4, 1), how

    def forward(self, x):
        h = torch.tanh(self.encoder(x))
        if self.how == "detach":
            h = h.detach()
        elif self.how == "data":
            h = h.data
        elif self.how == "no_grad":
            with torch.no_grad():
                h = torch.tanh(self.encoder(x))
        elif self.how == "numpy":
            h = torch.tensor(h.detach().numpy())
        elif self.how == "item":
            h = torch.full_like(x, h.mean().item())
        elif self.how == "argmax":
            h = h.argmax(dim=1, keepdim=True).float().expand(-1, 4)
        elif self.how == "compare":
            h = (h > 0).float()
        elif self.how == "int-cast":
            h = (h * 10).long().float()
        elif self.how == "unused":
            h = x
        elif self.how == "zero":
            h = torch.round(h * 0.01)
        elif self.how == "inplace":
            h[:, 0] = 0.0
        return self.head(h)


def diagnose(model, **kw):
    return diagnose_gradients(model, batch=(X, Y), loss_fn=nn.MSELoss(), **kw)


def test_healthy_model_reports_nothing():
    report = diagnose(TwoStage())
    assert report.healthy and report.findings == [] and report.notes == []
    assert "healthy" in str(report)


@pytest.mark.parametrize("how, cause", [
    ("detach", "detach"), ("data", "data"), ("no_grad", "no_grad"), ("numpy", "round-trip"),
    ("item", "round-trip"), ("argmax", "non-differentiable"), ("compare", "non-differentiable"),
    ("int-cast", "non-differentiable"), ("unused", "output-unused"),
])
def test_each_cut_is_named_with_its_cause(how, cause):
    report = diagnose(TwoStage(how))
    assert not report.healthy
    assert report.causes == {"encoder.weight": cause, "encoder.bias": cause}, str(report)
    assert all(f.module == "encoder" for f in report.missing)


def test_no_grad_names_the_module_whose_output_lost_its_grad_fn():
    class NoGradBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 4)

        def forward(self, x):
            with torch.no_grad():
                return self.inner(x)

    model = nn.Sequential(nn.Linear(4, 4), NoGradBlock(), nn.Linear(4, 1))
    report = diagnose(model)
    assert report.first_cut_module == "1.inner"
    assert set(report.causes.values()) == {"no_grad"} and set(report.causes) == {"0.weight", "0.bias",
                                                                                "1.inner.weight", "1.inner.bias"}


def test_never_called_layer_is_unused():
    class Spare(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.spare = nn.Linear(4, 1), nn.Linear(4, 1)

        def forward(self, x):
            return self.used(x)

    assert diagnose(Spare()).causes == {"spare.weight": "unused", "spare.bias": "unused"}


def test_frozen_parameters_are_reported_unless_allowed():
    model = TwoStage()
    model.encoder.requires_grad_(False)
    assert diagnose(model).causes == {"encoder.weight": "frozen", "encoder.bias": "frozen"}
    assert diagnose(model, allow_frozen=True).healthy


def test_plain_list_dict_and_tensor_attributes_are_unregistered():
    class Hidden(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = [nn.Linear(4, 4), nn.Linear(4, 4)]
            self.heads = {"main": nn.Linear(4, 1)}
            self.scale = torch.ones(1, requires_grad=True)
            self.ok = nn.ModuleList([nn.Linear(4, 4)])

        def forward(self, x):
            for block in [*self.blocks, *self.ok]:
                x = block(x)
            return self.heads["main"](x) * self.scale

    found = unregistered_parameters(Hidden())
    assert set(found) == {"blocks[0].weight", "blocks[0].bias", "blocks[1].weight", "blocks[1].bias",
                          "heads['main'].weight", "heads['main'].bias", "scale"}
    report = diagnose(Hidden())
    assert {f.parameter for f in report.unregistered} == set(found)
    assert not report.missing  # the registered layer still gets its gradient


def test_zero_vanishing_and_non_finite_gradients_are_flagged_apart_from_missing():
    assert set(diagnose(TwoStage("zero")).causes.values()) == {"zero"}
    deep = nn.Sequential(nn.Linear(4, 4), *[nn.Sigmoid() if i % 2 else nn.Linear(4, 4) for i in range(30)],
                         nn.Linear(4, 1))
    report = diagnose(deep, vanishing=1e-3)
    assert report.weak and not report.missing and {"0.weight", "0.bias"} <= {f.parameter for f in report.weak}
    assert {f.cause for f in report.weak} == {"vanishing"}
    blown = TwoStage()
    with torch.no_grad():
        blown.encoder.weight.fill_(float("nan"))
    assert "non-finite" in diagnose(blown).causes.values()


def test_inplace_error_is_reported_with_the_op():
    report = diagnose(TwoStage("inplace"))
    assert not report.healthy and "modified by an inplace operation" in report.backward_error
    assert report.inplace_ops and "__setitem__" in report.inplace_ops[0]


def test_loss_mode_uses_the_graph_and_leaves_grad_alone():
    model = TwoStage("detach")
    loss = nn.functional.mse_loss(model(X), Y)
    report = diagnose_gradients(model, loss=loss)
    assert report.causes == {"encoder.weight": "not-in-graph", "encoder.bias": "not-in-graph"}
    assert model.head.weight.grad is None
    loss.backward()  # the graph is still usable after diagnosing
    healthy = TwoStage()
    loss = nn.functional.mse_loss(healthy(X), Y)
    loss.backward(retain_graph=True)
    assert diagnose_gradients(healthy, loss=loss).stale == ["encoder.weight", "encoder.bias", "head.weight",
                                                            "head.bias"]


def test_batch_mode_restores_buffers_and_works_under_no_grad():
    model = nn.Sequential(nn.Linear(4, 4, bias=False), nn.BatchNorm1d(4), nn.Linear(4, 1))
    before = model[1].running_mean.clone()
    with torch.no_grad():
        report = diagnose_gradients(model, batch=X)
    assert report.healthy and torch.equal(model[1].running_mean, before)


def test_a_bias_before_batchnorm_has_a_vanishing_gradient():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))   # BN subtracts the bias again
    assert diagnose_gradients(model, batch=X).causes == {"0.bias": "vanishing"}


@pytest.mark.parametrize("kwargs, error, match", [
    ({"loss": torch.tensor(1.0)}, ValueError, "loss has no graph"),
    ({"loss": 1.5}, TypeError, "loss must be a torch.Tensor"),
    ({"loss": torch.ones(3, requires_grad=True) * 2}, ValueError, "must be a scalar"),
    ({}, ValueError, "exactly one of loss="),
    ({"batch": "X"}, TypeError, "batch must be"),
    ({"batch": (X, Y), "loss_fn": nn.MSELoss(reduction="none")}, ValueError, "must be a scalar"),
    ({"batch": X, "vanishing": 2.0}, ValueError, "vanishing"),
])
def test_bad_input_gets_a_clear_message(kwargs, error, match):
    with pytest.raises(error, match=match):
        diagnose_gradients(TwoStage(), **kwargs)


def test_model_without_parameters_and_freed_graph_are_refused():
    with pytest.raises(ValueError, match="has no parameters"):
        diagnose_gradients(nn.ReLU(), batch=X)
    with pytest.raises(TypeError, match="nn.Module"):
        diagnose_gradients(lambda x: x, batch=X)
    model = TwoStage()
    loss = nn.functional.mse_loss(model(X), Y)
    loss.backward()
    with pytest.raises(ValueError, match="already freed"):
        diagnose_gradients(model, loss=loss)


def test_saved_tensor_bytes_counts_what_backward_keeps():
    layer = nn.Linear(256, 256)
    x = torch.randn(64, 256)
    assert saved_tensor_bytes(lambda: layer(x)) >= 64 * 256 * 4
    with torch.no_grad():
        assert saved_tensor_bytes(lambda: layer(x)) == 0
    with pytest.raises(TypeError, match="callable"):
        saved_tensor_bytes(3)


def test_saved_tensor_bytes_can_leave_out_weights_and_input():
    mlp = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(32, 8)
    everything = saved_tensor_bytes(lambda: mlp(x))
    activations = saved_tensor_bytes(lambda: mlp(x), exclude=[x, *mlp.parameters()])
    assert activations == 32 * 16 * 4          # tanh's output, saved by tanh and by the second Linear
    assert everything == activations + 32 * 8 * 4 + 16 * 4 * 4  # plus the input and the second weight


def test_saved_tensors_measures_what_a_live_graph_still_holds():
    layer = nn.Linear(8, 16)
    x = torch.randn(32, 8)
    with SavedTensors() as saved:
        kept = torch.tanh(layer(x)).sum()      # saves x and tanh's output
        dropped = torch.tanh(layer(x)).sum()
    assert saved.recorded == 4
    del dropped
    assert saved.alive() == 2
    assert saved.held_bytes(exclude=[x]) == 32 * 16 * 4
    kept.backward()                            # backward frees what the graph saved
    assert saved.alive() == 0 and saved.held_bytes() == 0


def test_vanishing_detail_marks_its_figures_as_measured():
    model = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    report = diagnose_gradients(model, batch=torch.randn(16, 4, generator=torch.Generator().manual_seed(0)))
    assert report.weak[0].detail.startswith("RMS ≈") and "largest (≈" in report.weak[0].detail


def test_optimizer_gaps_are_reported():
    """A parameter with a gradient that no param group holds, or whose group has lr 0, does not learn."""
    model = TwoStage()
    opt = torch.optim.SGD(model.head.parameters(), lr=0.1)                 # the encoder was left out
    report = diagnose(model, optimizer=opt)
    assert not report.healthy
    assert report.causes == {"encoder.weight": "not-in-optimizer", "encoder.bias": "not-in-optimizer"}, str(report)
    assert "not-in-optimizer" in str(report)
    frozen_lr = torch.optim.SGD([{"params": model.encoder.parameters(), "lr": 0.0},
                                 {"params": model.head.parameters()}], lr=0.1)
    assert diagnose(model, optimizer=frozen_lr).causes == {"encoder.weight": "lr-zero", "encoder.bias": "lr-zero"}
    assert diagnose(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).healthy
    assert diagnose(model).healthy                                          # without optimizer=, not judged
    with pytest.raises(TypeError, match="optimizer must be"):
        diagnose(model, optimizer=[model.head.weight])


def test_optimizer_gap_not_reported_for_a_parameter_already_missing_its_gradient():
    model = TwoStage("detach")
    report = diagnose(model, optimizer=torch.optim.SGD(model.head.parameters(), lr=0.1))
    assert report.causes == {"encoder.weight": "detach", "encoder.bias": "detach"}


def test_a_buffer_that_requires_grad_is_reported():
    model = TwoStage()
    model.register_buffer("scale", torch.ones(1, requires_grad=True))     # learnable in intent, never stepped
    report = diagnose(model)
    assert not report.healthy
    assert report.causes == {"scale": "buffer"} and "scale" in report.parameters
    assert "register_buffer" in str(report) or "buffer" in str(report)
    plain = TwoStage()
    plain.register_buffer("scale", torch.ones(1))                          # a plain buffer is fine
    assert diagnose(plain).healthy


def test_stale_gradients_are_listed_in_both_modes_and_flagged_apart_from_healthy():
    model = TwoStage()
    nn.functional.mse_loss(model(X), Y).backward()                         # an earlier step, not zeroed
    report = diagnose(model)
    assert report.stale == ["encoder.weight", "encoder.bias", "head.weight", "head.bias"]
    assert report.has_stale_gradients and report.healthy                   # flow is fine; the loop decides
    assert "zero_grad" in str(report)
    model.zero_grad()
    assert not diagnose(model).has_stale_gradients


def test_batch_mode_keeps_the_random_state_of_every_device_in_use(monkeypatch):
    import ptlab.diagnose as diagnose_module

    seen = []
    real_keep = diagnose_module.kept_random_state

    def recording_keep(devices, *args, **kwargs):
        seen.append(sorted(map(str, devices)))
        return real_keep([], *args, **kwargs)

    monkeypatch.setattr(diagnose_module, "kept_random_state", recording_keep)
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 1)).train()
    before = torch.random.get_rng_state()
    diagnose(model)
    assert seen == [["cpu"]] and torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_rng_is_restored():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 1)).cuda().train()
    before = torch.cuda.get_rng_state()
    diagnose_gradients(model, batch=(X.cuda(), Y.cuda()), loss_fn=nn.MSELoss())
    assert torch.equal(torch.cuda.get_rng_state(), before)


class _TiedThroughData(nn.Module):
    """The head's weight is also read through .data (a cut path) besides its own path."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        return self.head(x) + x @ self.head.weight.data.T          # the second path carries no gradient


class _DetachedSidePath(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.side = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.body(x)
        return self.side(h) + 0.1 * h.detach()                      # body still learns through side


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(w)
        return x * w

    @staticmethod
    def backward(ctx, grad):
        (w,) = ctx.saved_tensors
        return grad * w, None                                       # no gradient for w


class _WithCustomFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.w = nn.Linear(4, 4), nn.Parameter(torch.ones(4))

    def forward(self, x):
        return _Scale.apply(self.lin(x), self.w)


def test_a_path_cut_through_data_is_reported_although_the_weight_still_gets_a_gradient():
    torch.manual_seed(0)
    report = diagnose_gradients(_TiedThroughData(), batch=(torch.randn(8, 4), torch.randn(8, 4)),
                                loss_fn=nn.functional.mse_loss)
    assert not report.healthy and report.causes == {"head.weight": "partial"}
    assert "`data`" in report.partial[0].detail
    assert not any("no parameter lost its gradient" in n for n in report.notes)


def test_a_detached_side_path_is_reported_as_partial_for_the_parameters_behind_it():
    torch.manual_seed(0)
    report = diagnose_gradients(_DetachedSidePath(), batch=(torch.randn(8, 4), torch.randn(8, 4)),
                                loss_fn=nn.functional.mse_loss)
    assert report.causes == {"body.weight": "partial", "body.bias": "partial"}


def test_a_custom_function_that_returns_no_gradient_is_named_not_blamed_on_no_grad():
    torch.manual_seed(0)
    report = diagnose_gradients(_WithCustomFunction(), batch=(torch.randn(8, 4), torch.randn(8, 4)),
                                loss_fn=nn.functional.mse_loss)
    assert report.causes == {"w": "custom-function"}
    assert "_Scale" in report.missing[0].detail


@pytest.mark.parametrize("inplace_relu", [nn.ReLU(inplace=True), lambda h: F.relu(h, inplace=True),
                                          lambda h: F.relu(h, True), nn.Dropout(0.5, inplace=True),
                                          lambda h: F.dropout(h, 0.5, True, True)],
                         ids=["nn.ReLU", "F.relu keyword", "F.relu positional", "nn.Dropout", "F.dropout positional"])
def test_an_op_asked_to_work_in_place_is_named_when_backward_fails(inplace_relu):
    """inplace=True ops are the common in-place ops of real models; the watcher sees them without a trailing '_'."""

    class AfterTanh(nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = nn.Linear(4, 4)

        def forward(self, x):
            return inplace_relu(torch.tanh(self.layer(x))).sum(dim=1, keepdim=True)   # tanh saved its output

    torch.manual_seed(0)
    X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    report = diagnose_gradients(AfterTanh(), batch=(X, X.sum(dim=1, keepdim=True)), loss_fn=nn.MSELoss())
    assert "modified by an inplace operation" in report.backward_error
    assert report.inplace_ops and "(inplace=True)` in the forward of" in report.inplace_ops[0]


def test_an_op_that_may_work_in_place_but_was_not_asked_is_not_named():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.ReLU(inplace=False), nn.Dropout(0.5), nn.Linear(4, 1))
    X = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    report = diagnose_gradients(model, batch=(X, X.sum(dim=1, keepdim=True)), loss_fn=nn.MSELoss())
    assert report.healthy and not report.inplace_ops
