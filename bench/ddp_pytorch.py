#!/usr/bin/env python3
"""PyTorch DistributedDataParallel peer for bench/run_ddp.sh (issues 16 and 30): torch 2.15 from
bench/peers/ (any torch works; the line names its version).

The MLP of examples/fashion-mnist-mlp.yaml (784-256-128-10, ReLU, SGD lr 0.05 momentum 0.9, a fixed
learning rate here, fused where this torch has the kernel), on synthetic Fashion-MNIST-shaped
batches held in memory. `--ranks N` forks N processes, rank r pinned to its own `--threads` cores
(the r-th group of the cores this process may use) with that many torch threads, joined by
torch.distributed's gloo backend on 127.0.0.1, the model wrapped in DistributedDataParallel with
gradient_as_bucket_view=True (the gradients are views into the all-reduce buckets: no copy in or
out) and bucket_cap_mb=--bucket-cap-mb (run_ddp.sh measures several and reports the best); each
rank trains on `--batch` samples per step, so the global batch is N x batch. `--ranks 1` trains
the plain model (no DDP, no process group) in one process on `--threads` cores: the single-rank
baselines (1 thread at the per-rank or the global batch; N threads at the global batch).

The step is Stoker's: uint8 samples normalised inside it (x / 127.5 - 1), forward (under
torch.autocast on cpu in bf16), cross-entropy on float32 logits, backward, SGD.

Timing: warm-up steps, then rank 0 picks the timed window's step count from the warm-up's speed
(broadcast, so every rank runs the same steps), a barrier, the window, a barrier. Prints one
key=value line (kind "pytorch"): samples_per_s is the global rate (N x batch x steps / window
seconds).

Run with the peers' Python and OPENBLAS_NUM_THREADS=1 (Debian's torch 1.13 does its fp32 matrix
products through the system BLAS; the line names the BLAS loaded):

    OPENBLAS_NUM_THREADS=1 bench/peers/venv/bin/python bench/ddp_pytorch.py --ranks 2 \\
        [--batch 128] [--bucket-cap-mb 1] [--seconds 3] [--precision bf16]
"""
import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import model_peer  # bench/model_peer.py (this script's directory is on sys.path)
from train_pytorch import build_model  # the same MLP as bench/train_pytorch.py


def loaded_blas():
    """The BLAS shared objects mapped into this process (after a matrix product)."""
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "blas" in os.path.basename(path):
                names.add(path)
    return sorted(names)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank, args, port, results):
    cores = sorted(os.sched_getaffinity(0))
    mine = {cores[(rank * args.threads + i) % len(cores)] for i in range(args.threads)}
    if not args.no_pin:
        os.sched_setaffinity(0, mine)
    torch.set_num_threads(args.threads)
    distributed = args.ranks > 1
    if distributed:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=args.ranks)

    torch.manual_seed(args.seed)  # same initial weights on every rank (DDP broadcasts rank 0's too)
    network = None
    if args.network:  # a job's cnn or resnet, as vision_bench --write_network wrote it
        import json

        from vision_pytorch import optimizer_for, pytorch_eval
        with open(args.network) as f:
            network = json.load(f)
        arch = network["architecture"]
        model = pytorch_eval.build_model(arch).to(memory_format=torch.channels_last)
        model.train()
    else:
        model = build_model(args.hidden)
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
                                                    gradient_as_bucket_view=True)
    if network is not None:
        optimizer, impl = optimizer_for(model, network["optimizer"])
        loss_fn = nn.CrossEntropyLoss(label_smoothing=arch.get("label_smoothing", 0.0))
        shape = list(network["sample_shape"])
    else:
        optimizer, impl = model_peer.make_optimizer(torch.optim.SGD, model.parameters(),
                                                    lr=args.lr, momentum=args.momentum)
        loss_fn = nn.CrossEntropyLoss()
        shape = [784]
    use_bf16 = args.precision == "bf16"

    # A pool of random batches per rank (a disjoint stream per rank), cycled.
    generator = torch.Generator().manual_seed(2024 + rank)
    pool = 32
    samples = torch.randint(0, 256, [pool, args.batch] + shape, dtype=torch.uint8,
                            generator=generator)
    labels = torch.randint(0, 10, (pool, args.batch), generator=generator)

    def step(i):
        b = i % pool
        if network is not None:  # normalised inside the step, as Stoker
            x = pytorch_eval.normalize(samples[b], arch)
        else:
            x = samples[b].float() * (1.0 / 127.5) - 1.0
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            logits = model(x)
        loss = loss_fn(logits.float(), labels[b])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss

    # The window's length comes from the warm-up's second half (the first steps allocate).
    half = args.warmup_steps // 2
    for i in range(half):
        loss = step(i)
    start = time.perf_counter()
    for i in range(half, args.warmup_steps):
        loss = step(i)
    step_seconds = (time.perf_counter() - start) / max(1, args.warmup_steps - half)
    steps = torch.tensor([max(10, round(args.seconds / step_seconds))])
    if distributed:
        dist.broadcast(steps, src=0)
        dist.barrier()
    steps = int(steps.item())
    start = time.perf_counter()
    for i in range(steps):
        loss = step(args.warmup_steps + i)
    if distributed:
        dist.barrier()
    elapsed = time.perf_counter() - start
    if rank == 0:
        results.put({"steps": steps, "elapsed": elapsed, "last_loss": loss.item(),
                     "blas": loaded_blas(), "torch_threads": torch.get_num_threads(),
                     "cores": sorted(mine), "optimizer": impl})
    if distributed:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, default=2, help="processes (1: plain model, no DDP)")
    parser.add_argument("--batch", type=int, default=128, help="samples per rank per step")
    parser.add_argument("--threads", type=int, default=1, help="cores and torch threads per rank")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed window (about)")
    parser.add_argument("--warmup-steps", type=int, default=40)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                        help="bf16: torch.autocast on cpu (fp32 weights and gradients)")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="DDP's bucket_cap_mb (25: its default)")
    parser.add_argument("--no-pin", action="store_true", help="experiment: leave ranks unpinned")
    parser.add_argument("--network", default="",
                        help="train this network (vision_bench --write_network's JSON: the "
                             "example CNN, ResNet-20; channels_last, its optimizer) instead of "
                             "the MLP")
    args = parser.parse_args()
    args.hidden = [int(h) for h in args.hidden.split(",")]
    if args.ranks < 1 or args.batch < 1 or args.threads < 1:
        sys.exit("--ranks, --batch and --threads must be at least 1")
    if args.ranks * args.threads > len(os.sched_getaffinity(0)):
        print(f"warning: {args.ranks} ranks x {args.threads} threads on "
              f"{len(os.sched_getaffinity(0))} cores share cores", file=sys.stderr)

    context = mp.get_context("fork")
    results = context.SimpleQueue()
    port = free_port()
    processes = [context.Process(target=run_rank, args=(r, args, port, results))
                 for r in range(args.ranks)]
    for p in processes:
        p.start()
    for p in processes:
        p.join()
    failed = [r for r, p in enumerate(processes) if p.exitcode != 0]
    if failed or results.empty():
        sys.exit(f"ranks {failed} failed (exit codes {[p.exitcode for p in processes]})")
    r = results.get()
    global_batch = args.ranks * args.batch
    fields = {
        "mode": "ddp-gloo" if args.ranks > 1 else "single", "ranks": args.ranks,
        "threads": r["torch_threads"], "batch_per_rank": args.batch, "global_batch": global_batch,
        "precision": args.precision, "input": "uint8,normalised-in-step",
        "model": (os.path.splitext(os.path.basename(args.network))[0] if args.network
                  else "784-" + "-".join(map(str, args.hidden)) + "-10"),
        "bucket_cap_mb": f"{args.bucket_cap_mb:g}" if args.ranks > 1 else "-",
        "gradient_as_bucket_view": int(args.ranks > 1), "optimizer": r["optimizer"],
        "steps": r["steps"], "seconds": f"{r['elapsed']:.4f}",
        "step_ms": f"{1e3 * r['elapsed'] / r['steps']:.4f}",
        "samples_per_s": f"{global_batch * r['steps'] / r['elapsed']:.1f}",
        "last_loss": f"{r['last_loss']:.4f}", "torch": torch.__version__,
        "cores": ",".join(map(str, r["cores"])),
        "openblas_num_threads": os.environ.get("OPENBLAS_NUM_THREADS", "unset"),
        "blas": ",".join(os.path.basename(b) for b in r["blas"]) or "none",
    }
    print("pytorch " + " ".join(f"{k}={v}" for k, v in fields.items()), flush=True)


if __name__ == "__main__":
    main()
