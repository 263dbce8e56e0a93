#!/usr/bin/env python3
"""PyTorch's side of bench/run_vision.sh: trains the network vision_bench --write_network wrote
(a job file's model, expanded by Stoker's spec/ code) on the CPU in each of PyTorch's
configurations (bench/model_peer.py: eager NCHW, eager channels_last, torch.compile default and
max-autotune; in bf16 each under torch.autocast), so that the row's figure is PyTorch's best, not
its default. Prints training samples/s in one key=value line per configuration, as vision_bench
does (error=... for one that fails; compile_s apart for the compiled ones).

The network is rebuilt from the checkpoint architecture JSON by scripts/pytorch_eval.py's
build_model (the torch.nn modules Stoker's checkpoints load into), so both sides train exactly
the layers the job file says. The step is what Stoker's is: uint8 samples normalised inside the
step (pytorch_eval.normalize), forward, cross-entropy with the job's label smoothing on float32
logits, backward, the job's optimizer (SGD with momentum/Nesterov or AdamW, fused where this
torch has the kernel; weight decay on Conv2d and Linear weights only, as Stoker's parameter
groups), gradient clipping when the job asks. bf16 is torch.autocast("cpu", dtype=torch.bfloat16),
how PyTorch trains in bf16 on a CPU. Four random batches in turn. Run with the peers' Python
(bench/peers/install.sh) and OPENBLAS_NUM_THREADS=1 (docs/toolchain.md, "Peers for benchmarks"):

    OPENBLAS_NUM_THREADS=1 bench/peers/venv/bin/python bench/vision_pytorch.py --network NET.json \\
        --precision bf16 [--configs eager,compile-default] [--seconds 3] [--warmup 3] [--threads 2]
"""
import argparse
import importlib.util
import json
import os
import sys

import torch
from torch import nn

_EVAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts",
                     "pytorch_eval.py")
_spec = importlib.util.spec_from_file_location("pytorch_eval", _EVAL)
pytorch_eval = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(pytorch_eval)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_peer  # noqa: E402


def optimizer_for(model, settings):
    """The job's optimizer (fused where this torch has the kernel) and "fused" or "default"."""
    decayed, other = [], []
    for module in model.modules():
        for name, parameter in module.named_parameters(recurse=False):
            is_weight = name == "weight" and isinstance(module, (nn.Conv2d, nn.Linear))
            (decayed if is_weight else other).append(parameter)
    groups = [{"params": decayed, "weight_decay": settings["weight_decay"]},
              {"params": other, "weight_decay": 0.0}]
    if settings["type"] == "adamw":
        return model_peer.make_optimizer(torch.optim.AdamW, groups, lr=settings["lr"],
                                         betas=(settings["beta1"], settings["beta2"]),
                                         eps=settings["eps"])
    return model_peer.make_optimizer(torch.optim.SGD, groups, lr=settings["lr"],
                                     momentum=settings["momentum"],
                                     nesterov=settings["nesterov"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--network", required=True)
    parser.add_argument("--precision", required=True,
                        help="fp32, bf16 or both (fp32,bf16): each measured in turn")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=0, help="0: the job's batch size")
    parser.add_argument("--configs", default="all",
                        help="comma-separated: eager, eager-channels-last, compile-default, "
                             "compile-max-autotune (all: these four), compile-*-channels-last")
    args = parser.parse_args()
    precisions = args.precision.split(",")
    if any(p not in ("fp32", "bf16") for p in precisions):
        parser.error(f"--precision {args.precision}: fp32 or bf16")
    with open(args.network) as f:
        network = json.load(f)
    arch = network["architecture"]
    conv = arch["type"] == "cnn"
    try:
        configs = model_peer.config_list(args.configs, conv)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    clip = network["optimizer"].get("clip_grad_norm", 0)
    batch = args.batch or network["batch"]
    shape = [batch] + list(network["sample_shape"])
    generator = torch.Generator().manual_seed(1)
    pool = [(torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator),
             torch.randint(0, network["classes"], (batch,), generator=generator))
            for _ in range(4)]
    def build(channels_last):
        torch.manual_seed(1)
        model = pytorch_eval.build_model(arch)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        model.train()
        optimizer, impl = optimizer_for(model, network["optimizer"])
        loss_fn = nn.CrossEntropyLoss(label_smoothing=arch.get("label_smoothing", 0.0))

        def forward_loss(samples, labels):
            x = pytorch_eval.normalize(samples, arch)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
                logits = model(x)
            return loss_fn(logits.float(), labels)

        def after_backward():
            if clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return forward_loss, after_backward, pool, {"optimizer": impl}

    def tail(step_seconds):
        return {"samples_per_s": f"{batch / step_seconds:.1f}",
                "mflop_per_sample": f"{network['mflop_per_sample']:.1f}"}

    for precision in precisions:
        use_bf16 = precision == "bf16"
        head = (f"pytorch network={network['name']} precision={precision} "
                f"threads={torch.get_num_threads()} batch={batch}")
        model_peer.run(configs, conv, head, args.seconds, args.warmup, 1, build, tail)


if __name__ == "__main__":
    main()
