"""PyTorch's side of vision_layers_test's PyTorchAgrees test: the network of PyTorchNet() in
vision_layers_test.cc as a torch module tree (so its state_dict names are the engine's), one
training step and an evaluation.

    /usr/bin/python3 pytorch_step.py IN OUT

IN holds lines "x <values>" (the batch, [N, 2, 6, 6] flattened), "y <labels>", "lr <value>" and
"p <name> <values>" for every tensor of the engine's Parameters() in order (buffers included). The
tensors are loaded with load_state_dict(strict=True). OUT receives "loss <training loss>", then
"p <name> <values>" for every state_dict tensor after one SGD step (buffers updated by the forward
pass), then "eval <summed loss in eval mode>".
"""
import sys

import torch
from torch import nn


class Residual(nn.Module):
    def __init__(self, layers, shortcut):
        super().__init__()
        self.layers = nn.Sequential(*layers)
        self.shortcut = nn.Sequential(*shortcut)

    def forward(self, x):
        return torch.relu(self.layers(x) + self.shortcut(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Conv2d(2, 4, 3, 1, 1), nn.BatchNorm2d(4), nn.ReLU(),
            Residual([nn.Conv2d(4, 6, 3, 2, 1, bias=False), nn.BatchNorm2d(6), nn.ReLU(),
                      nn.Conv2d(6, 6, 3, 1, 1, bias=False), nn.BatchNorm2d(6)],
                     [nn.Conv2d(4, 6, 1, 2, 0, bias=False), nn.BatchNorm2d(6)]),
            Residual([nn.Conv2d(6, 6, 3, 1, 1), nn.BatchNorm2d(6)], []),
            nn.AvgPool2d(3, 1, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(6, 5, bias=False), nn.BatchNorm1d(5), nn.GELU(), nn.Linear(5, 3))

    def forward(self, x):
        return self.layers(x)


def main():
    torch.set_num_threads(1)
    lines = [line.split() for line in open(sys.argv[1])]
    x = y = lr = None
    state = {}
    for line in lines:
        if line[0] == "x":
            x = torch.tensor([float(v) for v in line[1:]], dtype=torch.float32)
        elif line[0] == "y":
            y = torch.tensor([int(v) for v in line[1:]], dtype=torch.long)
        elif line[0] == "lr":
            lr = float(line[1])
        else:
            state[line[1]] = [float(v) for v in line[2:]]
    net = Net()
    reference = net.state_dict()
    loaded = {}
    for name, tensor in reference.items():
        values = torch.tensor(state[name], dtype=torch.float32).reshape(tensor.shape)
        loaded[name] = values.to(tensor.dtype)
    net.load_state_dict(loaded, strict=True)
    x = x.reshape(len(y), 2, 6, 6)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0)
    net.train()
    loss = loss_fn(net(x), y)
    loss.backward()
    optimizer.step()
    with open(sys.argv[2], "w") as out:
        out.write(f"loss {loss.item():.9g}\n")
        for name, tensor in net.state_dict().items():
            out.write("p " + name + " " + " ".join(f"{float(v):.9g}" for v in tensor.flatten()) + "\n")
        net.eval()
        with torch.no_grad():
            summed = nn.CrossEntropyLoss(label_smoothing=0.1, reduction="sum")(net(x), y)
        out.write(f"eval {summed.item():.9g}\n")


if __name__ == "__main__":
    main()
