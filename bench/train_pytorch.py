#!/usr/bin/env python3
"""PyTorch's side of bench/run_train.sh: the same MLP, data and optimizer as train_bench, in each
of PyTorch's configurations (bench/model_peer.py: eager, torch.compile default and max-autotune),
so that the row's figure is PyTorch's best, not its default.

The step is train_bench's: a batch of uint8 samples normalised inside the step (x / 127.5 - 1),
forward (under torch.autocast("cpu", dtype=torch.bfloat16) in bf16), cross-entropy on float32
logits, backward, SGD momentum 0.9 (fused where this torch has the kernel). 32 random batches in
turn. Prints one key=value line per precision and configuration (error=... for one that fails).

Run with the peers' Python (bench/peers/install.sh) and OPENBLAS_NUM_THREADS=1:

    OPENBLAS_NUM_THREADS=1 bench/peers/venv/bin/python bench/train_pytorch.py --threads 1 \\
        [--precisions fp32,bf16] [--configs eager,compile-default] [--seconds 3] [--warmup 30]
"""
import argparse
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model_peer  # noqa: E402


def build_model(hidden):
    layers, width = [], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=int, default=30, help="untimed steps before the window")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--configs", default="all",
                        help="comma-separated: eager, compile-default, compile-max-autotune "
                             "(all: every one)")
    args = parser.parse_args()
    try:
        configs = model_peer.config_list(args.configs, conv=False)
    except ValueError as error:
        parser.error(str(error))
    torch.set_num_threads(args.threads)
    hidden = [int(h) for h in args.hidden.split(",")]
    generator = torch.Generator().manual_seed(2024)
    pool = 32
    samples = torch.randint(0, 256, (pool, args.batch, 784), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (pool, args.batch), generator=generator)
    batches = [(samples[i], labels[i]) for i in range(pool)]
    name = "mlp-784-" + "-".join(map(str, hidden)) + "-10"
    forward_flops = 2 * sum(a * b for a, b in zip([784] + hidden, hidden + [10]))
    print(f"config torch={torch.__version__} threads={torch.get_num_threads()} "
          f"mkldnn={torch.backends.mkldnn.is_available()}", flush=True)

    for precision in args.precisions.split(","):
        use_bf16 = precision == "bf16"

        def build(channels_last):
            torch.manual_seed(1)
            model = build_model(hidden)
            optimizer, impl = model_peer.make_optimizer(torch.optim.SGD, model.parameters(),
                                                        lr=0.01, momentum=0.9)
            loss_fn = nn.CrossEntropyLoss()

            def forward_loss(x_uint8, y):
                # Normalisation is part of the step, as in Stoker (uint8 in, model-side scaling).
                x = x_uint8.float() * (1.0 / 127.5) - 1.0
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
                    logits = model(x)
                return loss_fn(logits.float(), y)

            def after_backward():
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            return forward_loss, after_backward, batches, {"optimizer": impl}

        def tail(step_seconds):
            rate = args.batch / step_seconds
            return {"samples_per_s": f"{rate:.0f}",
                    "train_gflops": f"{3 * forward_flops * rate / 1e9:.1f}"}

        head = (f"pytorch network={name} precision={precision} threads={torch.get_num_threads()} "
                f"batch={args.batch}")
        model_peer.run(configs, False, head, args.seconds, args.warmup, 20, build, tail)


if __name__ == "__main__":
    main()
