#!/usr/bin/python3
"""PyTorch baseline for bench/run_train.sh: the same MLP, data and optimizer as train_bench.

Run with OPENBLAS_NUM_THREADS=1 /usr/bin/python3 (Debian's python3-torch). Prints key=value lines.
"""
import argparse
import time

import torch
import torch.nn as nn


def build_model(hidden):
    layers, width = [], 784
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def bench(precision, hidden, batch, seconds, pool_samples, pool_labels):
    torch.manual_seed(1)
    model = build_model(hidden)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    scale, shift = 1.0 / 127.5, -1.0
    use_bf16 = precision == "bf16"

    def step(i):
        b = i % pool_samples.shape[0]
        # Normalisation is part of the step, as in Stoker (uint8 in, model-side scaling).
        x = pool_samples[b].float() * scale + shift
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
        loss = loss_fn(logits.float(), pool_labels[b])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    for i in range(30):
        step(i)
    steps, start = 0, time.perf_counter()
    while True:
        for _ in range(20):
            loss = step(steps)
            steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    step_seconds = elapsed / steps
    samples_per_second = batch / step_seconds
    forward_flops = 2 * sum(m.in_features * m.out_features for m in model if isinstance(m, nn.Linear))
    print(f"pytorch precision={precision} threads={torch.get_num_threads()} batch={batch} steps={steps} step_us={step_seconds * 1e6:.1f} "
          f"samples_per_s={samples_per_second:.0f} train_gflops={3 * forward_flops * samples_per_second / 1e9:.1f} "
          f"last_loss={loss.item():.4f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precisions", default="fp32,bf16")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hidden = [int(h) for h in args.hidden.split(",")]
    generator = torch.Generator().manual_seed(2024)
    pool = 32
    samples = torch.randint(0, 256, (pool, args.batch, 784), dtype=torch.uint8, generator=generator)
    labels = torch.randint(0, 10, (pool, args.batch), generator=generator)
    print(f"config torch={torch.__version__} threads={torch.get_num_threads()} "
          f"mkldnn={torch.backends.mkldnn.is_available()}", flush=True)
    for precision in args.precisions.split(","):
        bench(precision, hidden, args.batch, args.seconds, samples, labels)


if __name__ == "__main__":
    main()
