# expect: clean
# Knowledge distillation: a teacher is trained first, then frozen in eval mode; a smaller student learns from the
# teacher's softened outputs (KL divergence at temperature 4) and the true labels.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import blobs

torch.manual_seed(0)
train = blobs(n=1024, classes=4)
teacher = nn.Sequential(nn.Linear(8, 128), nn.BatchNorm1d(128), nn.ReLU(), nn.Linear(128, 4))
opt = torch.optim.Adam(teacher.parameters(), lr=1e-2)
for X, y in DataLoader(train, batch_size=64, shuffle=True):
    loss = F.cross_entropy(teacher(X), y)
    opt.zero_grad()
    loss.backward()
    opt.step()

teacher.eval().requires_grad_(False)
student = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
opt = torch.optim.Adam(student.parameters(), lr=1e-2)
T = 4.0
for epoch in range(2):
    for X, y in DataLoader(train, batch_size=64, shuffle=True):
        with torch.no_grad():
            soft = F.softmax(teacher(X) / T, dim=1)
        logits = student(X)
        kd = F.kl_div(F.log_softmax(logits / T, dim=1), soft, reduction="batchmean") * T * T
        loss = 0.7 * kd + 0.3 * F.cross_entropy(logits, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"epoch {epoch}: loss {loss.item():.3f}")
