"""Chapter 5 pitfalls for the troubleshooting clinic: NaN from the data or the init, overfitting, a second device."""
from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ptlab.claims import Check
from ptlab.clinic import first_nonfinite
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.lessons.ch05_checkpoints_debugging.blobs import blob_mlp, blobs, noisy_blobs
from ptlab.lessons.ch05_checkpoints_debugging.pitfalls_checkpoints import _accuracy


@pitfall(
    id="nan-from-a-poisoned-sample", chapter=5,
    title="One NaN in the data turns the loss, then every weight, into NaN",
    symptom="one NaN feature in 600 samples makes the loss NaN at the first full-batch step and "
            "leaves NaN in every weight tensor",
    why="""A NaN input propagates through every operation it touches: the forward pass, the loss (a mean
    over the batch), every gradient, and then every weight the optimizer updates. After one step the
    model is ruined, and nothing raised. The model is not to blame: the data is.""",
    catch="""Check the data where it enters: assert torch.isfinite(X).all() per batch (cheap), and find
    the sample (torch.isnan(X).any(dim=1).nonzero()). When a loss turns NaN, ask the data first:
    ptlab.clinic.first_nonfinite(model, X) says whether the input or a module produced it;
    torch.autograd.set_detect_anomaly(True) names the backward op.""",
)
def nan_from_a_poisoned_sample(buggy: bool) -> Outcome:
    X, y = blobs()
    X = X.clone()
    X[123, 1] = float("nan")                                   # one unreadable value, as a bad row in a CSV
    if not buggy:
        keep = torch.isfinite(X).all(dim=1)                    # FIX: find and drop (or repair) bad samples
        X, y = X[keep], y[keep]
    torch.manual_seed(0)
    model = blob_mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(5):
        loss = nn.functional.cross_entropy(model(X), y)         # BUG: a NaN input makes the mean loss NaN
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    nan_weights = sum(torch.isnan(p).any().item() for p in model.parameters())
    return Outcome(
        figures={"samples used": len(y), "first loss": losses[0], "weight tensors holding NaN": nan_weights},
        checks=[Check("first loss is NaN", losses[0] != losses[0], "is True"),
                Check("weight tensors holding NaN (of 6)", nan_weights, "== 6")],
    )


def deep_mlp(depth: int = 48, width: int = 256) -> nn.Sequential:
    """`depth` hidden layers (Linear + ReLU, `width` units) on the blobs' 2 features, then a 3-class head."""
    layers = [nn.Linear(2, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 3))


@pitfall(
    id="nan-from-init-scale", chapter=5,
    title="Weights initialised with std 1 overflow a deep MLP: the loss is NaN before the first update",
    symptom="in a 48-layer ReLU MLP 256 wide, the largest activation passes 1e15 by layer 24, a later "
            "layer overflows float32, and the first loss is NaN, on clean inputs",
    why="""With weights of std 1, each Linear + ReLU multiplies the activations' scale by about
    sqrt(fan_in / 2): 11 at width 256, so 48 layers would reach about 1e50, and float32 ends at 3.4e38.
    A sum past that is inf, a sum that meets both +inf and -inf is NaN, and the NaN reaches the loss
    before any weight has been updated. Nothing is wrong with the data or the learning rate: the
    scale is wrong from the start. Kaiming initialisation (std sqrt(2 / fan_in)) keeps it about
    constant from layer to layer.""",
    catch="""For ReLU networks call nn.init.kaiming_normal_(w, nonlinearity='relu') (xavier_normal_ for
    tanh); a hand-written layer scales torch.randn(fan_in, fan_out) by sqrt(2 / fan_in). PyTorch's
    default for nn.Linear, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), is scaled by the fan-in too and does not
    blow up this way; in a stack this deep it shrinks the signal instead (a scale of about 0.4 per layer
    with zero biases), which is why deep ReLU stacks want Kaiming. Before training, run one batch and print each
    layer's largest |activation|: a
    steady rise per layer is this bug. ptlab.clinic.first_nonfinite(model, X) names the first layer
    whose output is not finite, which tells the model from the data.""",
)
def nan_from_init_scale(buggy: bool) -> Outcome:
    X, y = blobs(n=16)                                         # clean inputs, each feature of scale ~1
    torch.manual_seed(0)
    model = deep_mlp(depth=48, width=256)
    for layer in model:
        if isinstance(layer, nn.Linear):
            if buggy:
                nn.init.normal_(layer.weight, std=1.0)          # BUG: std 1 whatever the fan-in
            else:
                nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")   # FIX: std sqrt(2 / fan_in)
            nn.init.zeros_(layer.bias)
    h, scale = X, []
    with torch.no_grad():
        for layer in model:
            h = layer(h)
            if isinstance(layer, nn.ReLU):                      # after each hidden layer
                scale.append(h.abs().amax().log10().item())     # log10 of the largest |activation|
        loss = nn.functional.cross_entropy(h, y).item()
    finite = [s for s in scale if math.isfinite(s)]
    found = first_nonfinite(model, X)
    return Outcome(
        figures={"first loss": loss, "growth per hidden layer (layers 1 to 24)": 10 ** ((scale[23] - scale[0]) / 23),
                 "first_nonfinite blames": f"a {found.module_type} layer" if found else "nothing"},
        checks=[Check("first loss is NaN", math.isnan(loss), "is True"),
                Check("log10 of the largest |activation| after hidden layer 24", scale[23], "> 15"),
                Check("hidden layers with a finite output, of 48", float(len(finite)), "< 48")],
        series={"log10 of the largest |activation|, finite layers": finite},
        x_label="hidden layer",
    )


@pitfall(
    id="overfitting-without-regularisation", chapter=5,
    title="A large model trained long on few noisy examples memorises them, noise included",
    symptom="on 40 training points with 12 wrong labels, training accuracy reaches 1.0 while held-out "
            "accuracy stays below 0.8 and trails it by more than 0.25",
    why="""With far more parameters than examples, a network can fit every training point, wrong labels
    included. The validation loss falls for a few steps, while the model learns the rule, then climbs
    for as long as training goes on, while it learns the noise: the last weights are the memorising ones.""",
    catch="""Always hold out a validation set and watch its loss next to the training loss. Keep the weights
    of the best validation epoch (early stopping: ptlab.train.fit's best.pt), and choose among remedies
    (weight decay, dropout, augmentation, more data) on validation, never on the test set. A training
    accuracy of 1.0 on data you know to be noisy is a warning, not a success.""",
)
def overfitting_without_regularisation(buggy: bool) -> Outcome:
    X, y = noisy_blobs(n_train=40, n_wrong=12)                  # 12 of the 40 training labels are wrong
    X_train, y_train = X[:40], y[:40]
    X_val, y_val, X_test, y_test = X[40:340], y[40:340], X[340:], y[340:]   # choose on val, report held-out
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 3))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    val_losses, best = [], (float("inf"), 0, None)
    for step in range(1, 301):                                  # BUG: 300 steps, and the last weights kept
        loss = nn.functional.cross_entropy(model(X_train), y_train)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            val_losses.append(nn.functional.cross_entropy(model(X_val), y_val).item())
        if not buggy and val_losses[-1] < best[0]:              # FIX: remember the best validation step
            best = (val_losses[-1], step, copy.deepcopy(model.state_dict()))
        if not buggy and step - best[1] >= 20:                  # FIX: stop 20 steps after it
            break
    if not buggy:
        model.load_state_dict(best[2])                          # FIX: keep the best step's weights
    train_acc, test_acc = _accuracy(model, X_train, y_train), _accuracy(model, X_test, y_test)
    return Outcome(
        figures={"training accuracy": train_acc, "held-out accuracy": test_acc,
                 "weights kept from step": float(best[1]) if not buggy else "300 (the last)"},
        checks=[Check("training accuracy", train_acc, "== 1.0"),
                Check("held-out accuracy", test_acc, "< 0.8"),
                Check("training minus held-out accuracy", train_acc - test_acc, "> 0.25")],
        series={"validation loss": val_losses},
    )


@pitfall(
    id="inputs-on-another-device", chapter=5,
    title="A model moved to one device and a batch left on another: the forward pass raises",
    symptom="the forward pass raises RuntimeError naming both devices",
    why="""`model.to(device)` moves the parameters in place; `X.to(device)` returns a new tensor and leaves X
    where it was. A batch from a DataLoader starts on the CPU, so a loop that moves the model but not
    each batch mixes devices in the first layer, which refuses. CI and most laptops have no GPU, so the
    reproduction uses the meta device (a real torch device that holds shapes only) as the second one;
    on a GPU the message reads 'Expected all tensors to be on the same device'.""",
    catch="""Move each batch where the model is: `X, y = X.to(device), y.to(device)` in the loop, with `device`
    set once at the top (or `next(model.parameters()).device`). Pass `device=` to torch.zeros/randn/arange
    for tensors made inside forward, or register them as buffers so .to moves them.""",
)
def inputs_on_another_device(buggy: bool) -> Outcome:
    device = torch.device("meta")                               # stands in for "cuda" on a CPU-only machine
    model = blob_mlp().to(device)                                   # parameters moved, in place
    X, _ = blobs()                                             # a batch as a DataLoader gives it: on the CPU
    if not buggy:
        X = X.to(device)                                        # FIX: the batch goes where the model is
    try:
        out = model(X)                                          # BUG: CPU batch, parameters on the other device
        error = "no error"
    except RuntimeError as err:
        error = str(err).split("\n")[0]
        out = None
    return Outcome(
        figures={"model on": str(next(model.parameters()).device), "batch on": str(X.device),
                 "output shape": str(tuple(out.shape)) if out is not None else "-"},
        checks=[Check("forward pass", error, "contains 'is not on the expected device'")],
    )


@pitfall(
    id="zero-grad-after-backward", chapter=5,
    title="zero_grad() between backward() and step(): every step finds no gradient, and the model never learns",
    symptom="after 50 SGD steps every weight is exactly as initialised and the accuracy stays below 0.5 (chance is "
            "0.33), where the same loop with zero_grad() before backward() gets above 0.9",
    why="""backward() writes the gradients into .grad and step() reads them from there. zero_grad() in between
    sets every .grad to None (or to zeros with set_to_none=False), so step() finds nothing to apply: SGD and
    Adam skip a parameter whose .grad is None. Nothing raises, the loss is computed and printed every step, and
    it simply never moves. It often comes from moving lines around, or from a helper that 'cleans up' after
    backward.""",
    catch="""Keep the three lines in this order: zero_grad(), backward(), step() (or zero_grad() right after
    step()). A loss that does not move at all, with weights that are exactly the initial ones, is the tell:
    check torch.equal on one weight before and after a step, or look at p.grad just before step(); the watch
    (`python -m ptlab watch`) reports a zero_grad() between the last backward() and the step.""",
)
def zero_grad_after_backward(buggy: bool) -> Outcome:
    X, y = blobs()
    torch.manual_seed(0)
    model = blob_mlp()
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(50):
        loss = nn.functional.cross_entropy(model(X), y)
        if not buggy:
            opt.zero_grad()                                     # FIX: clear the old gradients before backward
        loss.backward()
        if buggy:
            opt.zero_grad()                                     # BUG: throws away the gradients just computed
        opt.step()
    unchanged = sum(torch.equal(p.detach(), s) for p, s in zip(model.parameters(), start))
    accuracy = _accuracy(model, X, y)
    return Outcome(
        figures={"weight tensors unchanged (of 6)": unchanged, "accuracy": accuracy, "last loss": loss.item()},
        checks=[Check("weight tensors exactly as initialised (of 6)", unchanged, "== 6"),
                Check("accuracy after 50 steps", accuracy, "< 0.5")],
    )
