import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
def blobs(n=1024, classes=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(classes, 8, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    return TensorDataset(centres[y] + torch.randn(n, 8, generator=g), y)
def mlp(bn=True, drop=True):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), *([nn.BatchNorm1d(32)] if bn else []), nn.ReLU(),
                         *([nn.Dropout(0.1)] if drop else []), nn.Linear(32, 4))
