#!/usr/bin/env python3
"""Loads a Stoker checkpoint into PyTorch and evaluates it on an IDX test set.

A Stoker checkpoint is a safetensors file: the weights under their PyTorch names
("layers.<i>.weight" / ".bias"; a residual block's "layers.<i>.layers.<j>.*" and
"layers.<i>.shortcut.<j>.*"; BatchNorm's "weight", "bias", "running_mean", "running_var" and
"num_batches_tracked", the last as float32 [1]), the optimizer state under "optimizer.*", and the
model's architecture as JSON in the header's metadata ("model", see spec/model_spec.h). This
script rebuilds that architecture with torch.nn modules (Conv2d and Linear with or without bias,
BatchNorm2d/1d with the checkpoint's momentum and eps, MaxPool2d, AvgPool2d, AdaptiveAvgPool2d(1)
for global_avgpool, a Residual module with nn.Sequential `layers` and `shortcut`), loads the
weights with load_state_dict(strict=True), evaluates in eval() mode (BatchNorm on its running
statistics) and prints the test accuracy, so a trained model leaves Stoker without any Stoker
code. The loss uses the architecture's label_smoothing, as Stoker's evaluation does.

The file is read with the `safetensors` library when it is installed, else with a few lines of
spec-following parsing (8-byte little-endian header length, JSON header, raw little-endian data)
and torch.frombuffer: Debian 12 packages PyTorch but not safetensors.

The test images are uint8 and normalised as the model was trained: x = pixel * input_scale[c] +
input_shift[c], c the channel (input_shape[0] planes of a cnn's [C, H, W] input, input_channels
equal blocks of an mlp's flat input); each of the two is a number (one value for every channel, as
every checkpoint from before per-channel values holds) or a list of one value per channel.

  scripts/pytorch_eval.py CHECKPOINT [--images t10k-images-idx3-ubyte.gz]
                                     [--labels t10k-labels-idx1-ubyte.gz] [--limit N]
  scripts/pytorch_eval.py --verify CHECKPOINT
  scripts/pytorch_eval.py --parameters CHECKPOINT|ARCHITECTURE.json
Prints "accuracy=<fraction> samples=<n> loader=<safetensors|builtin> loss=<mean cross-entropy>"
and exits 0; exits 2 with a message on a file it cannot use. --verify needs the safetensors library: it reads the file with it
and with the built-in parser, checks that every tensor is identical, builds the model and loads
the weights (strict), and prints "verified=<tensors> safetensors=<version>" (exit 1 on any
difference), without a dataset. --parameters prints "parameters=<trainable count>" and each
state-dict entry of the rebuilt model (name, shape, dtype), reading only the architecture.
"""
import argparse
import gzip
import json
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

FASHION_MNIST = "/usr/share/datasets/fashion-mnist"


def fail(message):
    print(f"pytorch_eval: {message}", file=sys.stderr)
    sys.exit(2)


def read_with_library(path):
    from safetensors import safe_open  # noqa: PLC0415 (optional dependency)

    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}, "safetensors"


def read_safetensors(path):
    """(tensors by name, metadata) with the safetensors library if present, else by the spec."""
    try:
        return read_with_library(path)
    except ImportError:
        return read_builtin(path)


def read_builtin(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", blob[:8])
    if header_len > len(blob) - 8:
        fail(f"{path}: header length {header_len} runs past the end of the file")
    header = json.loads(blob[8 : 8 + header_len])
    data = memoryview(blob)[8 + header_len :]
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if entry["dtype"] not in dtypes:
            fail(f"{path}: tensor {name} has dtype {entry['dtype']}")
        begin, end = entry["data_offsets"]
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=dtypes[entry["dtype"]])
        tensors[name] = flat.reshape(entry["shape"])
    return tensors, header.get("__metadata__", {}), "builtin"


class Mlp(nn.Module):
    def __init__(self, arch):
        super().__init__()
        widths = [arch["input_features"]] + list(arch["hidden"]) + [arch["classes"]]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x):
        x = x.flatten(1)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i + 1 < len(self.layers):
                x = F.relu(x)
        return x


def _product(shape):
    features = 1
    for d in shape:
        features *= d
    return features


def _window(shape, spec, channels):
    """The [C, H, W] after a conv or pool window (PyTorch's floor mode)."""
    _, h, w = shape
    k, s, p = spec["kernel"], spec["stride"], spec["padding"]
    return [channels, (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1]


class Sequence(nn.Sequential):
    """torch.nn.Sequential (so layer j of a list is named "<list>.<j>"), except that a Linear
    flattens a [C, H, W] input itself, as Stoker's does."""

    def forward(self, x):
        for layer in self:
            if isinstance(layer, nn.Linear) and x.dim() > 2:
                x = x.flatten(1)
            x = layer(x)
        return x


class Residual(nn.Module):
    """activation(layers(x) + shortcut(x)), an empty shortcut being the identity; its parameters
    are "layers.<j>.*" and "shortcut.<j>.*" as in a Stoker checkpoint."""

    def __init__(self, spec, shape):
        super().__init__()
        self.layers, out = build_layers(spec["layers"], shape)
        self.shortcut, short = build_layers(spec.get("shortcut", []), shape)
        if out != short:
            fail(f"a residual block's branches end in {out} and {short}")
        self.activation = spec.get("activation", "relu")
        if self.activation not in ("relu", "gelu", "none"):
            fail(f"unknown residual activation {self.activation!r}")
        self.out_shape = out

    def forward(self, x):
        y = self.layers(x) + self.shortcut(x)
        if self.activation == "relu":
            return F.relu(y)
        if self.activation == "gelu":
            return F.gelu(y)
        return y


def build_layers(specs, shape):
    """(Sequence of torch modules for the architecture's `specs` on inputs of `shape`, the output
    shape)."""
    modules = []
    shape = list(shape)
    for spec in specs:
        kind = spec["type"]
        if kind == "conv2d":
            modules.append(nn.Conv2d(shape[0], spec["out_channels"], spec["kernel"], spec["stride"],
                                     spec["padding"], bias=spec.get("bias", True)))
            shape = _window(shape, spec, spec["out_channels"])
        elif kind == "maxpool2d":
            modules.append(nn.MaxPool2d(spec["kernel"], spec["stride"], spec["padding"]))
            shape = _window(shape, spec, shape[0])
        elif kind == "avgpool2d":
            # PyTorch's defaults are Stoker's: floor mode, count_include_pad=True.
            modules.append(nn.AvgPool2d(spec["kernel"], spec["stride"], spec["padding"]))
            shape = _window(shape, spec, shape[0])
        elif kind == "global_avgpool":
            modules.append(nn.AdaptiveAvgPool2d(1))
            shape = [shape[0], 1, 1]
        elif kind == "linear":
            modules.append(nn.Linear(_product(shape), spec["units"], bias=spec.get("bias", True)))
            shape = [spec["units"]]
        elif kind in ("batchnorm2d", "batchnorm1d"):
            norm = nn.BatchNorm2d if kind == "batchnorm2d" else nn.BatchNorm1d
            modules.append(norm(shape[0], eps=spec.get("eps", 1e-5),
                                momentum=spec.get("momentum", 0.1)))
        elif kind == "residual":
            block = Residual(spec, shape)
            modules.append(block)
            shape = block.out_shape
        elif kind == "relu":
            modules.append(nn.ReLU())
        elif kind == "gelu":
            modules.append(nn.GELU())
        elif kind == "dropout":
            modules.append(nn.Dropout(spec["rate"]))
        elif kind == "flatten":
            modules.append(nn.Flatten())
            shape = [_product(shape)]
        else:
            fail(f"unknown layer type {kind!r} in the checkpoint's architecture")
    return Sequence(*modules), shape


class Cnn(nn.Module):
    """Layer i of the job file is self.layers[i], as in torch.nn.Sequential; a residual block's
    layers are self.layers[i].layers[j] and self.layers[i].shortcut[j]."""

    def __init__(self, arch):
        super().__init__()
        self.input_shape = list(arch["input_shape"])
        self.layers, _ = build_layers(arch["layers"], self.input_shape)

    def forward(self, x):
        return self.layers(x.reshape([x.shape[0]] + self.input_shape))


def state_dict_for(model, tensors):
    """The checkpoint's weights (optimizer state left out) as `model`'s state dict expects them:
    float32, except BatchNorm's num_batches_tracked, which Stoker stores as float32 [1] and
    PyTorch keeps as an int64 scalar."""
    expected = model.state_dict()
    weights = {}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            continue
        target = expected.get(name)
        if target is not None and not target.is_floating_point():
            if value.numel() != 1:
                fail(f"{name} holds {value.numel()} values, expected 1")
            weights[name] = torch.tensor(round(value.float().item()), dtype=target.dtype)
        else:
            weights[name] = value.float()
    return weights


def read_idx(path, limit):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        blob = f.read()
    magic, count = struct.unpack(">II", blob[:8])
    dims = magic & 0xFF
    shape = [count] + list(struct.unpack(">" + "I" * (dims - 1), blob[8 : 4 + 4 * dims]))
    data = torch.frombuffer(bytearray(blob[4 + 4 * dims :]), dtype=torch.uint8).reshape(shape)
    return data[:limit] if limit else data


def build_model(arch):
    return Mlp(arch) if arch["type"] == "mlp" else Cnn(arch)


def input_channels(arch):
    """The channels the normalisation sees: C of a cnn's [C, H, W] input, an mlp's input_channels
    (absent in older checkpoints: 1)."""
    if arch["type"] == "cnn":
        shape = arch["input_shape"]
        return shape[0] if len(shape) == 3 else 1
    return arch.get("input_channels", 1)


def normalize(images, arch):
    """uint8 images [N, ...] -> float32 [N, ...]: pixel * input_scale[c] + input_shift[c], a
    multiply then an add in float32, as Stoker computes it."""
    channels = input_channels(arch)
    per_channel = []
    for key in ("input_scale", "input_shift"):
        values = arch[key] if isinstance(arch[key], list) else [arch[key]]
        if len(values) not in (1, channels):
            fail(f"the checkpoint's {key} holds {len(values)} values for {channels} channels")
        per_channel.append(torch.tensor(values, dtype=torch.float32).view(1, -1, 1))
    scale, shift = per_channel
    x = images.reshape(images.shape[0], channels, -1).float()
    if x.shape[2] * channels != images[0].numel():
        fail(f"test samples of {images[0].numel()} values do not split into {channels} channels")
    return (x * scale + shift).reshape(images.shape)


def verify(path):
    import safetensors  # noqa: PLC0415 (required here)

    library, library_meta, _ = read_with_library(path)
    builtin, builtin_meta, _ = read_builtin(path)
    problems = []
    if library.keys() != builtin.keys():
        problems.append(f"tensor names differ: {sorted(library.keys() ^ builtin.keys())}")
    for name in library.keys() & builtin.keys():
        if library[name].dtype != builtin[name].dtype or not torch.equal(library[name], builtin[name]):
            problems.append(f"tensor {name} differs")
    if library_meta != builtin_meta:
        problems.append("metadata differs")
    model = build_model(json.loads(library_meta["model"]))
    model.load_state_dict(state_dict_for(model, library), strict=True)
    for problem in problems:
        print(f"pytorch_eval: {problem}", file=sys.stderr)
    print(f"verified={len(library)} safetensors={safetensors.__version__} "
          f"model={library_meta['model'][:60]}...")
    sys.exit(1 if problems else 0)


def describe(path):
    """Prints "parameters=<trainable count>" and then each state-dict entry with its shape."""
    if path.endswith(".json"):
        with open(path) as f:
            arch = json.load(f)
    else:
        _, metadata, _ = read_safetensors(path)
        arch = json.loads(metadata["model"])
    model = build_model(arch)
    print(f"parameters={sum(p.numel() for p in model.parameters())}")
    for name, value in model.state_dict().items():
        print(f"{name} {list(value.shape)} {str(value.dtype).replace('torch.', '')}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint")
    parser.add_argument("--verify", action="store_true",
                        help="compare the safetensors library's reading with the built-in one")
    parser.add_argument("--images", default=f"{FASHION_MNIST}/t10k-images-idx3-ubyte.gz")
    parser.add_argument("--labels", default=f"{FASHION_MNIST}/t10k-labels-idx1-ubyte.gz")
    parser.add_argument("--limit", type=int, default=0, help="first N test samples (0 = all)")
    parser.add_argument("--parameters", action="store_true",
                        help="print the rebuilt model's parameter count and state-dict names "
                             "(no checkpoint weights or dataset needed; CHECKPOINT may be a JSON "
                             "architecture file)")
    args = parser.parse_args()

    if args.parameters:
        describe(args.checkpoint)
        return
    try:
        if args.verify:
            verify(args.checkpoint)
            return
        tensors, metadata, loader = read_safetensors(args.checkpoint)
    except (OSError, ValueError, KeyError) as error:
        fail(f"{args.checkpoint}: cannot read it as a safetensors checkpoint: {error}")
    if "model" not in metadata:
        fail(f"{args.checkpoint}: no 'model' architecture in its metadata (an older checkpoint?)")
    arch = json.loads(metadata["model"])
    model = build_model(arch)
    model.load_state_dict(state_dict_for(model, tensors), strict=True)
    model.eval()  # BatchNorm on its running statistics, dropout off: as Stoker evaluates

    try:
        images = read_idx(args.images, args.limit)
        labels = read_idx(args.labels, args.limit).long()
    except (OSError, ValueError, struct.error) as error:
        fail(f"cannot read the test set: {error}")
    if len(images) == 0 or len(images) != len(labels):
        fail(f"the test set has {len(images)} images and {len(labels)} labels")
    with torch.no_grad():
        x = normalize(images, arch)
        correct = 0
        loss_sum = 0.0
        for begin in range(0, len(x), 1000):
            logits = model(x[begin : begin + 1000])
            batch_labels = labels[begin : begin + 1000]
            correct += (logits.argmax(1) == batch_labels).sum().item()
            loss_sum += F.cross_entropy(logits.double(), batch_labels, reduction="sum",
                                        label_smoothing=arch.get("label_smoothing", 0.0)).item()
    print(f"accuracy={correct / len(labels):.4f} samples={len(labels)} loader={loader} "
          f"loss={loss_sum / len(labels):.6f}")


if __name__ == "__main__":
    main()
