"""An accelerate training loop that reports its steps to gpulaunch (docs/progress.md).

    gpulaunch start --nproc 2 examples/progress_accelerate.py

gpulaunch sets torchrun's environment, so `Accelerator()` finds its rank and world
size there as it does under `accelerate launch`. After each optimizer step (with
gradient accumulation: when `accelerator.sync_gradients`) every rank reports its step;
`status`, `top` and --hang-timeout read them. Needs `pip install accelerate torch`.
"""

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset

from gpulaunch.progress import ready, status, step

EPOCHS = 2
accelerator = Accelerator(gradient_accumulation_steps=2)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data = DataLoader(TensorDataset(torch.randn(512, 16), torch.randn(512, 1)), batch_size=8)
model, optimizer, data = accelerator.prepare(model, optimizer, data)
total = EPOCHS * len(data) // accelerator.gradient_accumulation_steps

ready()
done = 0
for epoch in range(EPOCHS):
    status(f"epoch {epoch}")
    for x, y in data:
        with accelerator.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            done += 1
            step(done, total=total)
accelerator.print(f"{done} optimizer steps on each of {accelerator.num_processes} ranks")
