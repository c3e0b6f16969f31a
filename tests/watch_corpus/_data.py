"""Small seeded data sets for the watch corpus: made in memory, nothing downloaded, a fraction of a second each."""
import torch
from torch.utils.data import TensorDataset


def blobs(n: int = 1024, classes: int = 4, dim: int = 8, seed: int = 0, spread: float = 3.0) -> TensorDataset:
    """`classes` Gaussian blobs in `dim` dimensions, labels in random order; `seed` draws the points, and every seed
    shares the same centres (a validation set is the same task)."""
    centres = spread * torch.randn(classes, dim, generator=torch.Generator().manual_seed(1000 + classes))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, dim, generator=g), y)


def images(n: int = 512, classes: int = 4, size: int = 12, seed: int = 0) -> TensorDataset:
    """1-channel images: a class-dependent bright square on noise, labels in random order."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, classes, (n,), generator=g)
    X = 0.5 * torch.randn(n, 1, size, size, generator=g)
    for k in range(classes):
        r, c = divmod(k, 2)
        X[y == k, :, 2 + 5 * r:5 + 5 * r, 2 + 5 * c:5 + 5 * c] += 2.0
    return TensorDataset(X, y)


def sequences(n: int = 256, length: int = 40, seed: int = 0) -> torch.Tensor:
    """A noisy sine per row, (n, length, 1): the next value is predictable from the past ones."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length).float()
    phase = 6.28 * torch.rand(n, 1, generator=g)
    return (torch.sin(0.3 * t + phase) + 0.05 * torch.randn(n, length, generator=g)).unsqueeze(-1)
