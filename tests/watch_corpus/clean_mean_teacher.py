# expect: clean
# Mean teacher (semi-supervised): the teacher is an EMA of the student, run in train mode under no_grad with its own
# input noise and dropout on purpose; a consistency loss pulls the student towards the teacher on unlabelled data.
import copy

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
student = nn.Sequential(nn.Linear(8, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 4))
teacher = copy.deepcopy(student)
teacher.requires_grad_(False)
opt = torch.optim.Adam(student.parameters(), lr=1e-2)
labelled = DataLoader(blobs(n=256), batch_size=16, shuffle=True)
unlabelled = DataLoader(blobs(n=1024, seed=2), batch_size=64, shuffle=True)
for epoch in range(2):
    for (X, y), (U, _) in zip(labelled, unlabelled):
        with torch.no_grad():
            target = teacher(U + 0.1 * torch.randn_like(U)).softmax(1)     # teacher: train mode, on purpose
        consistency = F.mse_loss(student(U + 0.1 * torch.randn_like(U)).softmax(1), target)
        loss = F.cross_entropy(student(X), y) + 3.0 * consistency
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            for pt, ps in zip(teacher.parameters(), student.parameters()):
                pt.lerp_(ps, 0.01)
    print(f"epoch {epoch}: loss {loss.item():.3f}")
