"""Chapter 4 pitfall: choosing a model by its test accuracy, then reporting that same test accuracy.

The candidates are 100 small classifiers that differ only by their seed: each is a nearest-class-mean classifier
on the reference model's pooled features, built from 5 random training images per class. They are cheap (no
training loop), so the reproduction can repeat the whole choose-and-report experiment 100 times and average.
"""
from __future__ import annotations

import functools

import torch

from ptlab.claims import Check
from ptlab.course.pitfall_record import Outcome, pitfall
from ptlab.data import normalize_uint8, train_val_split, uint8_split
from ptlab.reference import reference_model


@functools.lru_cache(maxsize=1)
def _candidates_right(n_candidates: int = 100, per_class: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """For each candidate, which validation images (N_val,) and test images (2000,) it classifies right."""
    images, labels = uint8_split(True)
    test_images, test_labels = uint8_split(False)
    train_idx, val_idx = (torch.tensor(i) for i in train_val_split(labels, val_fraction=0.1, seed=0))
    model = reference_model()

    @torch.no_grad()
    def features(x: torch.Tensor) -> torch.Tensor:              # (N, 64): the pooled features the head reads
        return torch.cat([model.pool(model.features(normalize_uint8(x[i:i + 500]))).flatten(1)
                          for i in range(0, len(x), 500)])

    pool = train_idx[:1000]                                     # candidates draw their few images from here
    pool_features, pool_labels = features(images[pool]), labels[pool]
    g = torch.Generator().manual_seed(0)
    centroids = []                                              # (n_candidates, 10, 64)
    for _ in range(n_candidates):
        per_class_means = []
        for c in range(10):
            members = torch.nonzero(pool_labels == c).flatten()
            pick = members[torch.randperm(len(members), generator=g)[:per_class]]
            per_class_means.append(pool_features[pick].mean(0))
        centroids.append(torch.stack(per_class_means))
    centroids = torch.stack(centroids)
    right_val = torch.cdist(features(images[val_idx]), centroids).argmin(-1) == labels[val_idx]     # (K, 800)
    right_test = torch.cdist(features(test_images), centroids).argmin(-1) == test_labels            # (K, 2000)
    return right_val, right_test


@pitfall(
    id="choosing-by-test-accuracy", chapter=4,
    title="Choosing the best model by test accuracy and then reporting that test accuracy: the score is optimistic",
    symptom="over 100 trials, the chosen candidate's score on the 50 test images used to choose is more than "
            "0.05 above its score on 1,000 test images nobody looked at",
    why="""Every accuracy measured on a finite set is the true accuracy plus noise (on 50 images, about
    plus or minus 0.07). Pick the best of many candidates (seeds, epochs, learning rates, thresholds) by
    that measurement and you pick, partly, the candidate whose noise was luckiest on those images: its score
    there is biased upwards, and the more candidates and the smaller the set, the larger the bias. The
    test set has then been used for training decisions and is no longer a test. Chosen on a validation set
    carved from the training data, the same candidate's test score is an honest estimate again.""",
    catch="""Split a validation set from the training data (ptlab.data.train_val_split: seeded, stratified),
    make every choice on it (epochs, early stopping, hyperparameters, the checkpoint to keep), and
    evaluate the test split once, at the end. If a test score has been looked at to decide anything, say
    so, or score the final choice on data held out from the start.""",
)
def choosing_by_test_accuracy(buggy: bool) -> Outcome:
    right_val, right_test = _candidates_right()                 # 100 candidates x images: classified right?
    reported, fresh = [], []
    for trial in range(100):                                    # the whole experiment, repeated 100 times
        g = torch.Generator().manual_seed(trial)
        small_test = torch.randperm(1000, generator=g)[:50]     # 50 of the first 1,000 test images
        small_val = torch.randperm(right_val.shape[1], generator=g)[:50]   # 50 validation images
        if buggy:
            best = right_test[:, small_test].float().mean(1).argmax()      # BUG: choose by test accuracy
        else:
            best = right_val[:, small_val].float().mean(1).argmax()        # FIX: choose on validation
        reported.append(right_test[best, small_test].float().mean().item())  # the test score you report
        fresh.append(right_test[best, 1000:].float().mean().item())        # 1,000 test images never looked at
    gap = (sum(reported) - sum(fresh)) / len(reported)
    return Outcome(
        figures={"reported test accuracy (mean of 100 trials)": sum(reported) / 100,
                 "accuracy on 1,000 fresh test images": sum(fresh) / 100, "reported minus fresh": gap},
        checks=[Check("reported test accuracy minus fresh held-out accuracy, mean of 100 trials", gap, "> 0.05")],
    )
