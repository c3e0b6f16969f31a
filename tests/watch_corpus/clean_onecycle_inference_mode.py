# expect: clean
# A standard CNN recipe: OneCycleLR stepped every batch, weight decay, label smoothing, validation every epoch in
# eval mode under torch.inference_mode, logits collected for a confusion matrix.
import torch
from torch import nn
from torch.utils.data import DataLoader

from _data import images

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 4))
loader = DataLoader(images(), batch_size=32, shuffle=True)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=3 * len(loader))
criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
for epoch in range(3):
    model.train()
    for X, y in loader:
        loss = criterion(model(X), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    with torch.inference_mode():
        logits = [model(X) for X, _ in DataLoader(images(seed=1, n=128), batch_size=64)]
    confusion = torch.zeros(4, 4, dtype=torch.long)
    for (_, y), out in zip(DataLoader(images(seed=1, n=128), batch_size=64), logits):
        confusion.index_put_((y, out.argmax(1)), torch.ones_like(y), accumulate=True)
    print(f"epoch {epoch}: validation accuracy {confusion.diag().sum().item() / 128:.3f}")
