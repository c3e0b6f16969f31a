"""A short training script with three bugs, for `python -m ptlab watch` to find (chapter 5, the clinic).

    python -m ptlab watch ptlab/lessons/ch05_checkpoints_debugging/buggy_training.py --steps 30

It trains a width-8 SmallCNN on the embedded dataset for a few seconds and evaluates it. It runs without an
error and prints plausible numbers; the three lines marked `# BUG` are what the watch reports.
"""
from __future__ import annotations

import argparse

import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from ptlab.data import normalize_uint8, uint8_split
from ptlab.models import SmallCNN


def main(argv: list[str] | None = None) -> float:
    """Train for --batches batches, evaluate on the test split; returns the test accuracy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--batches", type=int, default=30, help="training batches (the watch's own option is --steps)")
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW learning rate")
    parser.add_argument("--batch-size", type=int, default=64, help="training batch size")
    args = parser.parse_args(argv)

    torch.manual_seed(0)
    images, labels = uint8_split(train=True)                                # (N, 3, 32, 32) uint8, (N,)
    train_loader = DataLoader(TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True)
    model = SmallCNN(width=8)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    model.train()
    running_loss = 0.0
    for step, (X, y) in zip(range(args.batches), train_loader):
        logits = model(normalize_uint8(X))                                  # (B, 10)
        loss = F.cross_entropy(logits.softmax(dim=1), y)                    # BUG: softmax before cross_entropy
        opt.zero_grad()
        loss.backward()
        opt.step()
        running_loss += loss                                                # BUG: a tensor, keeps every graph
    print(f"mean training loss: {running_loss.item() / args.batches:.3f}")

    test_images, test_labels = uint8_split(train=False)
    correct = 0
    with torch.no_grad():                                                   # no model.eval() before this:
        for start in range(0, len(test_labels), 250):
            pred = model(normalize_uint8(test_images[start:start + 250])).argmax(dim=1)  # BUG: still train mode
            correct += int((pred == test_labels[start:start + 250]).sum())
    accuracy = correct / len(test_labels)
    print(f"test accuracy: {accuracy:.3f}")
    return accuracy


if __name__ == "__main__":
    main()
