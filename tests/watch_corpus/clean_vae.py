# expect: clean
# A variational autoencoder: reconstruction (binary cross-entropy with logits, summed) plus the KL term, with a KL
# weight warmed up from 0 to 1 over the first epoch, so the total loss can rise while the model improves.
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader

from _data import images

torch.manual_seed(0)
enc = nn.Sequential(nn.Flatten(), nn.Linear(144, 64), nn.ReLU(), nn.Linear(64, 2 * 4))
dec = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 144))
opt = torch.optim.Adam([*enc.parameters(), *dec.parameters()], lr=3e-3)
data = images(n=512)
step = 0
for epoch in range(2):
    for X, _ in DataLoader(data, batch_size=32, shuffle=True):
        target = (X.flatten(1) > 0.5).float()
        mu, logvar = enc(X).chunk(2, dim=1)
        z = mu + torch.randn_like(mu) * (0.5 * logvar).exp()
        recon = F.binary_cross_entropy_with_logits(dec(z), target, reduction="sum") / len(X)
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum() / len(X)
        beta = min(1.0, step / 16)
        loss = recon + beta * kl
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
    print(f"epoch {epoch}: reconstruction {recon.item():.1f}, KL {kl.item():.2f}")
