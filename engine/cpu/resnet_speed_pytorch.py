"""The peer of resnet_speed.cc: the same ResNet-20-like network in PyTorch 1.13 on the CPU,
training samples/s in fp32 and bf16 (torch.autocast(cpu, bfloat16), as PyTorch trains in bf16 on
a CPU), 2 threads. Run with /usr/bin/python3 and OPENBLAS_NUM_THREADS=1 (docs/toolchain.md,
"Peers for benchmarks").

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 engine/cpu/resnet_speed_pytorch.py [batch] [steps]
"""
import sys
import time

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, in_channels, channels, stride):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(in_channels, channels, 3, stride, 1, bias=False), nn.BatchNorm2d(channels),
            nn.ReLU(), nn.Conv2d(channels, channels, 3, 1, 1, bias=False),
            nn.BatchNorm2d(channels))
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride, 0, bias=False),
                nn.BatchNorm2d(channels))

    def forward(self, x):
        return torch.relu(self.layers(x) + self.shortcut(x))


def resnet20():
    layers = [nn.Conv2d(1, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    in_channels = 16
    for stage in range(3):
        channels = 16 << stage
        for block in range(3):
            layers.append(Block(in_channels, channels, 2 if stage > 0 and block == 0 else 1))
            in_channels = channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


def main():
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 128
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    torch.set_num_threads(2)
    torch.manual_seed(1)
    print("torch", torch.__version__, "threads", torch.get_num_threads(),
          "mkldnn", torch.backends.mkldnn.is_available())
    x = torch.rand(batch, 1, 28, 28) * 2 - 1
    y = torch.randint(0, 10, (batch,))
    for precision in ("fp32", "bf16"):
        model = resnet20()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
        loss_fn = nn.CrossEntropyLoss()

        def step():
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            return loss.item()

        for _ in range(3):
            step()
        start = time.perf_counter()
        for _ in range(steps):
            loss = step()
        seconds = time.perf_counter() - start
        print(f"pytorch {precision}: batch {batch}, {steps} steps, {steps * batch / seconds:.1f} "
              f"samples/s ({1000 * seconds / steps:.1f} ms/step), last loss {loss:.4f}")


if __name__ == "__main__":
    main()
