# clean: a DistributedSampler with set_epoch every epoch; one batch peeked before training
import torch, torch.nn.functional as F
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
from common import blobs, mlp
ds = blobs(); sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True)
loader = DataLoader(ds, batch_size=32, sampler=sampler)
print("first batch:", next(iter(loader))[0].shape)
model = mlp(); opt = torch.optim.AdamW(model.parameters(), 1e-2)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for X, y in loader:
        loss = F.cross_entropy(model(X), y); opt.zero_grad(); loss.backward(); opt.step()
print("done")
