"""Chapter 4 pitfalls: training bugs, each reproduced on a real SmallCNN and measured.

Each reproduction trains or evaluates a width-16 SmallCNN on the embedded dataset for a few seconds.
The ones that need trained weights start from the models shipped in data/ (ptlab.reference: a 10-class
reference model, and a backbone pretrained on part of the classes), each a fresh copy, so no pitfall sees
another's side effects. Every verdict is a list of named checks (ptlab.claims.Check) whose bounds hold with
a wide margin on any machine (chance accuracy is 0.10; a fresh classifier's loss is ln(10) = 2.303).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Subset

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.data import CLASSES, EmbeddedImages, make_transform, uint8_split
from ptlab.data import normalize_uint8 as normalize
from ptlab.memory import SavedTensors
from ptlab.models import SmallCNN
from ptlab.reference import WIDTH as _WIDTH
from ptlab.reference import accuracy_on_test, batch_stream, reference_model
from ptlab.results import predict


def _fresh_model_and_optimizer(lr: float = 1e-2) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = SmallCNN(width=_WIDTH)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def _short_recipe(steps: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.OneCycleLR]:
    """A fresh width-16 SmallCNN, AdamW and a OneCycleLR schedule (max 1e-2) over `steps` batches."""
    model, opt = _fresh_model_and_optimizer(lr=1e-2)
    return model, opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=1e-2, total_steps=steps)


def _smooth(values: list[float], k: int = 10) -> float:
    return sum(values[-k:]) / len(values[-k:])


@pitfall(
    id="missing-zero-grad-training", chapter=4,
    title="A training loop without optimizer.zero_grad() sums every past gradient into each step",
    symptom="after 100 steps the training loss is still above 2.15 (it starts near ln(10) = 2.303), "
            "where the same run with zero_grad() gets below it",
    why="""backward() adds into .grad. Without zero_grad() the gradient used at step t is the sum of all
    gradients since the start: a stale direction dominated by the first steps, growing without bound.
    Adam's normalisation hides the growth in size but not the stale direction, so the model barely moves
    towards a solution; with SGD the growing sum makes the steps explode instead.""",
    catch="""Write the step as the fixed triple: optimizer.zero_grad(); loss.backward(); optimizer.step().
    Log the gradient norm: when it climbs steadily over identical-looking batches, gradients accumulate.
    ptlab.diagnose.diagnose_gradients(model, loss=loss) reports .grad already holding an earlier gradient.""",
)
def missing_zero_grad_training(buggy: bool) -> Outcome:
    model, opt, sched = _short_recipe(steps=100)               # AdamW + OneCycleLR, as in the chapter
    losses = []
    for _, (X, y) in zip(range(100), batch_stream(seed=0)):     # 100 batches of 64
        loss = F.cross_entropy(model(X), y)
        if not buggy:
            opt.zero_grad()                                     # FIX: each step sees only its own gradient
        loss.backward()                                         # BUG: without zero_grad, .grad sums all steps
        opt.step()
        sched.step()
        losses.append(loss.item())
    accuracy = accuracy_on_test(model)
    return Outcome(
        figures={"training loss, last 10 steps": _smooth(losses), "test accuracy": accuracy},
        checks=[Check("training loss, last 10 steps", _smooth(losses), "> 2.15")],
        series={"training loss": losses},
    )


@pitfall(
    id="eval-without-eval-mode", chapter=4,
    title="Evaluating without model.eval(): BatchNorm uses each test batch's statistics and overwrites its own",
    symptom="evaluated at batch 8, accuracy is more than 0.03 below the eval-mode accuracy, "
            "and a running statistic moves by more than 0.5",
    why="""In train mode BatchNorm normalises with the mean and variance of the current batch, so each
    prediction depends on which other images share its batch: noisy at batch 8. It also updates its
    running_mean and running_var from those batches (momentum 0.1): in train mode every forward pass
    moves them, so after such an 'evaluation' the model that you later evaluate properly, or
    checkpoint, carries statistics estimated from small test batches. torch.no_grad() prevents
    neither: it only stops the graph.""",
    catch="""Call model.eval() before evaluating and model.train() after (ptlab.train.evaluate does both and
    restores each submodule's mode). Evaluate twice at two batch sizes: in eval mode the accuracy is
    the same; a clear difference means some layer still runs in train mode. Compare the BatchNorm buffers
    before and after evaluation in a test.""",
)
def eval_without_eval_mode(buggy: bool) -> Outcome:
    model = reference_model()                                   # trained, in eval mode
    reference = accuracy_on_test(model)                         # batch 500, eval mode
    stats_before = [b.clone() for name, b in model.named_buffers() if "running" in name]
    if buggy:
        model.train()                                           # BUG: BatchNorm normalises with batch statistics
    else:
        model.eval()                                            # FIX: BatchNorm uses its running statistics
    images, labels = uint8_split(False)
    with torch.no_grad():                                       # no_grad does not change BatchNorm's mode
        correct = sum(int((model(normalize(images[i:i + 8])).argmax(1) == labels[i:i + 8]).sum())
                      for i in range(0, 2000, 8))               # batch 8, as a per-request service would
    stats_after = [b for name, b in model.named_buffers() if "running" in name]
    drift = max((a - b).abs().max().item() for a, b in zip(stats_after, stats_before))
    after = accuracy_on_test(model)                             # a proper evaluation afterwards
    return Outcome(
        figures={"accuracy, eval mode, batch 500": reference, "accuracy as evaluated, batch 8": correct / 2000,
                 "largest change of a running statistic": drift, "accuracy afterwards, eval mode": after},
        checks=[Check("accuracy at batch 8 minus eval-mode accuracy", correct / 2000 - reference, "< -0.03"),
                Check("largest change of a running statistic", drift, "> 0.5")],
    )


@pitfall(
    id="test-time-augmentation", chapter=4,
    title="Random augmentation left in the test transform makes the predictions, and so the accuracy, random",
    symptom="the same weights evaluated twice predict a different class for more than 10 of the first 1,000 test "
            "images",
    why="""RandomCrop and RandomHorizontalFlip draw new random numbers for every image at every pass. In the
    test pipeline they turn a fixed model and a fixed test set into random predictions and a random
    accuracy: comparing two models (or two epochs) then compares noise as much as models. Whether the
    expected accuracy also drops depends on the model: the crops shift part of a glyph out of the frame, and
    on both the chapter's trained model (section 7 prints its figures, not checked) and this reference model
    the loss was around 0.01 or less, small next to how far two evaluations of the same weights disagree.""",
    catch="""Build two pipelines: make_transform(augment=True) for training only, make_transform(augment=False)
    for validation and test. Evaluate the same model twice: the predictions must be identical.""",
)
def test_time_augmentation(buggy: bool) -> Outcome:
    model = reference_model()
    first = range(1000)                                         # the first 1,000 test images
    deterministic = Subset(EmbeddedImages(train=False, transform=make_transform(augment=False)), first)
    if buggy:
        test_set = EmbeddedImages(train=False, transform=make_transform(augment=True))   # BUG: random crops and flips
    else:
        test_set = EmbeddedImages(train=False, transform=make_transform(augment=False))  # FIX: deterministic
    baseline_pred, labels = predict(model, DataLoader(deterministic, batch_size=500))
    predictions = []
    for seed in (1, 2):                                         # the same weights, evaluated twice
        torch.manual_seed(seed)
        predictions.append(predict(model, DataLoader(Subset(test_set, first), batch_size=500))[0])
    changed = int((predictions[0] != predictions[1]).sum())
    accuracies = [(p == labels).float().mean().item() for p in (baseline_pred, *predictions)]
    return Outcome(
        figures={"accuracy, deterministic test transform": accuracies[0], "evaluation 1": accuracies[1],
                 "evaluation 2": accuracies[2], "images predicted differently": float(changed)},
        checks=[Check("test images (of 1,000) predicted differently by the two evaluations", float(changed), "> 10")],
    )


@pitfall(
    id="softmax-before-cross-entropy", chapter=4,
    title="Softmax before CrossEntropyLoss squashes the gradient: the model learns slower",
    symptom="after 100 steps the cross-entropy of the logits is still above 2.15, "
            "where the same run on logits gets below it",
    why="""nn.CrossEntropyLoss applies log_softmax itself: it expects raw logits. Fed probabilities, it
    computes softmax twice. Probabilities lie in [0, 1], so the second softmax sees nearly equal inputs:
    the loss cannot go below about 1.46 for 10 classes, and its gradient is scaled down by the softmax
    Jacobian, which is small wherever the model is confident. Nothing raises; training is just worse.""",
    catch="""Models return logits; apply softmax only where you need probabilities for display, never before
    CrossEntropyLoss (or use NLLLoss on log_softmax). A loss that plateaus above 1.4 with 10 classes is
    the tell; so is a last layer named softmax in print(model).""",
)
def softmax_before_cross_entropy(buggy: bool) -> Outcome:
    model, opt, sched = _short_recipe(steps=100)
    losses = []
    for _, (X, y) in zip(range(100), batch_stream(seed=0)):     # 100 batches of 64
        logits = model(X)                                       # (64, 10)
        if buggy:
            loss = F.cross_entropy(logits.softmax(dim=1), y)    # BUG: probabilities into a loss that wants logits
        else:
            loss = F.cross_entropy(logits, y)                   # FIX: raw logits
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(F.cross_entropy(logits.detach(), y).item())  # the true loss, comparable both ways
    accuracy = accuracy_on_test(model)
    return Outcome(
        figures={"cross-entropy on logits, last 10 steps": _smooth(losses), "test accuracy": accuracy},
        checks=[Check("cross-entropy on logits, last 10 steps", _smooth(losses), "> 2.15")],
        series={"cross-entropy on logits": losses},
    )


@pitfall(
    id="eval-without-no-grad", chapter=4,
    title="Evaluation without torch.no_grad() keeps a graph, and its activations, for every batch you keep",
    symptom="the collected logits carry a grad_fn and keep more than 10 MiB of saved activations alive",
    why="""Outside no_grad every forward records a graph and saves the activations backward would need.
    Evaluation never calls backward, so they are freed only when the output is: keep the logits of every
    batch (for a confusion matrix, say) and you keep every batch's activations with them. Memory grows
    with the test set; on a GPU, with a test set large enough, that becomes an out-of-memory error halfway
    through evaluation. The accuracy
    is not affected (the figures show it both ways): this bug costs memory, not accuracy. The MiB are
    measured: a saved-tensor hook records every tensor autograd saves, and counts the storages still
    alive after the loop.""",
    catch="""Evaluate under torch.no_grad() or torch.inference_mode() (ptlab.train.evaluate does). Check that
    collected outputs have grad_fn None, or keep logits.detach().cpu(). Memory that grows during
    evaluation is the tell.""",
)
def eval_without_no_grad(buggy: bool) -> Outcome:
    model = reference_model()                                   # eval mode: only no_grad differs
    images, labels = uint8_split(False)
    all_logits = []
    with SavedTensors() as saved:                               # records every tensor autograd saves
        for start in range(0, 2000, 250):                       # 8 batches of 250
            X = normalize(images[start:start + 250])
            if buggy:
                logits = model(X)                               # BUG: records a graph that holds the activations
            else:
                with torch.no_grad():
                    logits = model(X)                           # FIX: no graph, nothing saved
            all_logits.append(logits)                           # kept for a confusion matrix later
    held_mib = saved.held_bytes(exclude=model.parameters()) / 2**20   # still alive after the loop
    accuracy = (torch.cat(all_logits).argmax(1) == labels[:2000]).float().mean().item()
    has_graph = all_logits[0].grad_fn is not None
    return Outcome(
        figures={"MiB of saved activations held": held_mib, "accuracy": accuracy, "outputs have a grad_fn": has_graph},
        checks=[Check("the kept logits have a grad_fn", has_graph, "is True"),
                Check("MiB of saved activations held after the loop", held_mib, "> 10")],
    )


@pitfall(
    id="learning-rate-too-high", chapter=4,
    title="A learning rate far too high: the loss shoots up by orders of magnitude and the model is ruined",
    symptom="with Adam at lr=1000 the training loss goes above 100 and is still above 10 after 40 steps "
            "(it starts at ln(10) = 2.303)",
    why="""Adam divides each gradient by its running root-mean-square, so every weight moves by about lr per step,
    whatever the gradient's size. At lr=1000 the weights jump by about a thousand each step, the logits follow, and
    within a few steps the loss is orders of magnitude above where it started; after 40 steps it is still far above
    ln(10). In this four-layer network every loss of this run is finite (the figures count the others), and training
    simply destroys the model. BatchNorm is not what keeps it finite here: the notebook runs the same 40 steps with
    every BatchNorm removed, checks that those losses are finite too and that no weight moves by more than about
    1,500 in one of those steps, so none passes about 60,000 in 40 steps, and through four layers the logits stay
    within float32's range. Depth changes that: in a stack of ten plain convolutions the activations multiply such
    weights layer after layer and the loss overflows within a few steps, and a BatchNorm after each convolution
    keeps it finite (the notebook runs both). AdamW's decoupled weight decay (default 0.01) is another way out of
    float32's range: each step multiplies every weight by 1 - lr * weight_decay, which is 1 - 1000 * 0.01 = -9 here,
    so the weights grow ninefold per step, and a weight of a thousand passes float32's largest value within 40 such
    steps (the chapter checks that multiplier and prints that count).""",
    catch="""Log the loss every step: a loss far above its starting value (ln(num_classes) for a fresh
    classifier) means the step is too large; stop at the first non-finite one with torch.isfinite(loss).
    Start from a known-good learning rate (1e-3 to 1e-2 for Adam), keep lr * weight_decay far below 1,
    and run a learning-rate range test before training at a new scale.""",
)
def learning_rate_too_high(buggy: bool) -> Outcome:
    if buggy:
        lr = 1e3                                                # BUG: 250,000x the recipe's 4e-3
    else:
        lr = 4e-3                                               # FIX: the recipe's learning rate
    torch.manual_seed(0)
    model = SmallCNN(width=_WIDTH)
    opt = torch.optim.Adam(model.parameters(), lr=lr)           # no weight decay: only the step size differs
    losses = []
    for _, (X, y) in zip(range(40), batch_stream(seed=0)):      # 40 batches of 64
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return Outcome(
        figures={"learning rate": f"{lr:g}", "first loss": losses[0], "largest loss": max(losses),
                 "loss, last 5 steps": _smooth(losses, k=5),
                 "non-finite losses": sum(not math.isfinite(v) for v in losses)},
        checks=[Check("largest training loss", max(losses), "> 100"),
                Check("training loss, last 5 steps", _smooth(losses, k=5), "> 10")],
        series={"log10 training loss": [math.log10(v) for v in losses]},
    )


def adam_at_lr_1000_without_batchnorm(steps: int = 40) -> tuple[list[float], float]:
    """learning-rate-too-high's run (Adam at lr=1000, the same model, seed and batches) with every BatchNorm2d
    replaced by nn.Identity: its losses, and the largest move of any weight in one step, divided by lr."""
    torch.manual_seed(0)
    model = SmallCNN(width=_WIDTH)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.BatchNorm2d):
                setattr(module, name, nn.Identity())
    opt = torch.optim.Adam(model.parameters(), lr=1e3)
    losses, largest_move = [], 0.0
    for _, (X, y) in zip(range(steps), batch_stream(seed=0)):   # 40 batches of 64
        before = [p.detach().clone() for p in model.parameters()]
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        largest_move = max(largest_move, *((p.detach() - b).abs().max().item()
                                           for p, b in zip(model.parameters(), before)))
    return losses, largest_move / 1e3


def adam_at_lr_1000_deep_plain_cnn(batchnorm: bool, depth: int = 10, steps: int = 40) -> list[float]:
    """Adam at lr=1000 on `depth` 3x3 convolutions of width 24, each followed by a ReLU (with a BatchNorm2d before
    it when batchnorm), global average pooling and a linear head: its losses on `steps` batches of 16."""
    torch.manual_seed(0)
    layers, channels = [], 3
    for _ in range(depth):
        layers.append(nn.Conv2d(channels, 24, 3, padding=1, bias=False))       # (B, 24, 32, 32)
        if batchnorm:
            layers.append(nn.BatchNorm2d(24))                                   # renormalises every layer
        layers.append(nn.ReLU())
        channels = 24
    model = nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(24, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e3)
    losses = []
    for _, (X, y) in zip(range(steps), batch_stream(seed=0, batch_size=16)):
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pitfall(
    id="shuffled-labels", chapter=4,
    title="Images shuffled but labels taken from the unshuffled rows: the loss stays near ln(10)",
    symptom="after 100 batches the training loss is still above 2.15 (ln(10) = 2.303), with no error, "
            "where the same run with matching labels gets below it",
    why="""Indexing images with a permutation and labels with the plain range pairs each image with another
    image's label. The labels are still valid and balanced, so nothing raises, but they carry no
    information about the image: on a short budget the best the model can do is predict the class
    frequencies, whose cross-entropy is ln(10) for 10 balanced classes. Trained long enough, a network
    memorises the wrong pairs instead: the training loss falls while validation accuracy stays at chance.""",
    catch="""Index inputs and targets with the same indices, in one place (a Dataset returning (x, y) pairs).
    Before training, look at a batch of images with their labels printed on them. During training,
    evaluate on held-out data every epoch: a training loss that stays at ln(num_classes), or training
    accuracy that climbs while validation accuracy stays at chance, is the tell. Overfitting one batch
    does not catch it: a network memorises one batch of wrong labels as easily as right ones.""",
)
def shuffled_labels(buggy: bool) -> Outcome:
    images, labels = uint8_split(True)
    model, opt, sched = _short_recipe(steps=100)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    losses = []
    for start in range(0, 100 * 64, 64):                        # 100 batches of 64
        idx = order[start:start + 64]
        X = normalize(images[idx])
        if buggy:
            y = labels[start:start + 64]                        # BUG: rows of the unshuffled order
        else:
            y = labels[idx]                                     # FIX: the same indices as the images
        loss = F.cross_entropy(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    final, accuracy = _smooth(losses, k=20), accuracy_on_test(model)
    return Outcome(
        figures={"training loss, last 20 steps": final, "ln(10)": math.log(10), "test accuracy": accuracy},
        checks=[Check("training loss, last 20 steps", final, "> 2.15")],
        series={"training loss": losses},
    )


@pitfall(
    id="vertical-flip-changes-label", chapter=4,
    title="RandomVerticalFlip turns arrow_up into arrow_down: an augmentation that changes the label",
    symptom="fine-tuned on the two arrow classes with the flip, the model tells them apart on fewer than "
            "70% of the test arrows (a coin toss gets 50%)",
    why="""An augmentation must keep the label true. In this dataset arrow_down is exactly arrow_up seen in
    a vertical mirror: a vertical flip turns half the 'arrow_up' training images into perfect
    arrow_down images still labelled arrow_up. Each image appears with both labels equally often, so
    nothing can be learned about orientation. A horizontal flip is safe for the arrows (they are
    left-right symmetric), and both flips are safe for the other classes, which are their own mirror
    image and are drawn at any rotation. Digits (6 and 9) and text have the same trap.""",
    catch="""For each augmentation ask: would a human still give the augmented image the same label? Plot a
    grid of augmented training images with their labels before training, and compare per-class
    accuracy with and without the augmentation (the confusion matrix shows the arrow pair).""",
)
def vertical_flip_changes_label(buggy: bool) -> Outcome:
    from torchvision.transforms import v2

    if buggy:
        flip = v2.RandomVerticalFlip()                          # BUG: a flipped arrow_up is an arrow_down
    else:
        flip = v2.RandomHorizontalFlip()                        # FIX: a mirrored arrow keeps its label
    train_tf = v2.Compose([flip])                               # on the stored uint8 images; normalised per batch
    arrows = [CLASSES.index("arrow_up"), CLASSES.index("arrow_down")]
    train_set = EmbeddedImages(train=True, transform=train_tf)
    train_idx = [i for i, t in enumerate(train_set.targets) if t in arrows]       # 1,600 arrows
    loader = DataLoader(Subset(train_set, train_idx), batch_size=64, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)                                        # the flips draw from torch's global generator
    model = reference_model().train()                           # trained on all 10 classes, with a safe flip
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(4):                                          # fine-tune on the arrows: 4 epochs of 25 batches
        for X, y in loader:
            loss = F.cross_entropy(model(normalize(X)), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    images, labels = uint8_split(False)
    test_idx = torch.isin(labels, torch.tensor(arrows))
    with torch.no_grad():
        pred = model.eval()(normalize(images[test_idx])).argmax(1)                 # (400,)
    accuracy = (pred == labels[test_idx]).float().mean().item()
    return Outcome(figures={"test accuracy on the two arrow classes": accuracy, "training images": len(train_idx)},
                   checks=[Check("test accuracy on the two arrow classes", accuracy, "< 0.7")])
