#!/usr/bin/python3
"""PyTorch's side of bench/run_vision.sh: trains the network vision_bench --write_network wrote
(a job file's model, expanded by Stoker's spec/ code) in PyTorch 1.13 on the CPU and prints
training samples/s in the same key=value line as vision_bench.

The network is rebuilt from the checkpoint architecture JSON by scripts/pytorch_eval.py's
build_model (the torch.nn modules Stoker's checkpoints load into), so both sides train exactly
the layers the job file says. The step is what Stoker's is: uint8 samples normalised inside the
step (pytorch_eval.normalize), forward, cross-entropy with the job's label smoothing on float32
logits, backward, the job's optimizer (SGD with momentum/Nesterov or AdamW; weight decay on
Conv2d and Linear weights only, as Stoker's parameter groups), gradient clipping when the job
asks. bf16 is torch.autocast("cpu", dtype=torch.bfloat16), how PyTorch trains in bf16 on a CPU.
Four random batches in turn. Run with /usr/bin/python3 and OPENBLAS_NUM_THREADS=1
(docs/toolchain.md, "Peers for benchmarks").

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 bench/vision_pytorch.py --network NET.json \\
        --precision bf16 [--seconds 3] [--warmup 3] [--threads 2]
"""
import argparse
import importlib.util
import json
import os
import time

import torch
from torch import nn

_EVAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                     "pytorch_eval.py")
_spec = importlib.util.spec_from_file_location("pytorch_eval", _EVAL)
pytorch_eval = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pytorch_eval)


def optimizer_for(model, settings):
    decayed, other = [], []
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            is_weight = name == "weight" and isinstance(module, (nn.Conv2d, nn.Linear))
            (decayed if is_weight else other).append(parameter)
    groups = [{"params": decayed, "weight_decay": settings["weight_decay"]},
              {"params": other, "weight_decay": 0.0}]
    if settings["type"] == "adamw":
        return torch.optim.AdamW(groups, lr=settings["lr"],
                                 betas=(settings["beta1"], settings["beta2"]),
                                 eps=settings["eps"])
    return torch.optim.SGD(groups, lr=settings["lr"], momentum=settings["momentum"],
                           nesterov=settings["nesterov"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--network", required=True)
    parser.add_argument("--precision", choices=("fp32", "bf16"), required=True)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with open(args.network) as f:
        network = json.load(f)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    arch = network["architecture"]
    model = pytorch_eval.build_model(arch)
    model.train()
    optimizer = optimizer_for(model, network["optimizer"])
    clip = network["optimizer"].get("clip_grad_norm", 0)
    loss_fn = nn.CrossEntropyLoss(label_smoothing=arch.get("label_smoothing", 0.0))
    batch = network["batch"]
    shape = [batch] + list(network["sample_shape"])
    generator = torch.Generator().manual_seed(1)
    pool = [(torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator),
             torch.randint(0, network["classes"], (batch,), generator=generator))
            for _ in range(4)]
    use_bf16 = args.precision == "bf16"

    def step(i):
        samples, labels = pool[i % len(pool)]
        x = pytorch_eval.normalize(samples, arch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
        loss = loss_fn(logits.float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        return loss

    for i in range(args.warmup):
        step(i)
    steps, start = 0, time.perf_counter()
    while True:
        loss = step(steps)
        steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= args.seconds and steps >= 3:
            break
    print(f"pytorch network={network['name']} precision={args.precision} "
          f"threads={torch.get_num_threads()} batch={batch} steps={steps} "
          f"step_ms={1000 * elapsed / steps:.2f} samples_per_s={steps * batch / elapsed:.1f} "
          f"last_loss={loss.item():.4f} mflop_per_sample={network['mflop_per_sample']:.1f}",
          flush=True)


if __name__ == "__main__":
    main()
