# expect: clean
# Review K2 w3: the course's SmallCNN (width 8) on the embedded images, correct shuffled labels, plain SGD at
# lr 0.01 for 100 steps: it learns, slowly (the loss is still close to ln(10) at the end). Nothing is wrong.
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from ptlab.data import normalize_uint8, uint8_split
from ptlab.models import SmallCNN

torch.manual_seed(0)
images, labels = uint8_split(train=True)
loader = DataLoader(TensorDataset(images[:6400], labels[:6400]), batch_size=64, shuffle=True)
model = SmallCNN(width=8)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (X, y) in enumerate(loader):
    loss = F.cross_entropy(model(normalize_uint8(X)), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"after {step + 1} steps: loss {loss.item():.3f}")
