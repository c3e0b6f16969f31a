# expect: zero-grad-after-backward
# source: http://xiaobeizi.cn/x/6iuujguWdu (a translated Stack Overflow question: a regression whose loop runs
# loss.backward(); optimizer.zero_grad(); optimizer.step(); the model does not fit y = 2x).
import sys

import torch
from torch import nn

FIXED = "--fixed" in sys.argv
X = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
Y = torch.tensor([[2.0], [4.0], [6.0], [8.0]])
torch.manual_seed(0)
model = nn.Linear(1, 1)
criterion = nn.MSELoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
for epoch in range(300):
    loss = criterion(model(X), Y)
    if FIXED:
        optimizer.zero_grad()                                    # FIX: before backward
    loss.backward()
    if not FIXED:
        optimizer.zero_grad()                                    # BUG: between backward and step
    optimizer.step()
prediction = model(torch.tensor([[10.0]])).item()
print(f"symptom shows: {abs(prediction - 20) > 1} (prediction for x = 10 is {prediction:.2f}; y = 2x says 20)")
