"""The configurations PyTorch's side of the model benchmarks is measured in (bench/train_pytorch.py,
bench/vision_pytorch.py), so that every row compares against PyTorch's best, not its default
(issue 30):

    eager                        the model as written (NCHW); in bf16 under torch.autocast
    eager-channels-last          conv nets: the model's parameters in channels_last
    compile-default              torch.compile(step) (mode "default")
    compile-max-autotune         torch.compile(step, mode="max-autotune")
    compile-*-channels-last      either compiled mode on a channels_last model (only on request:
                                 inductor already lays convolutions out channels_last on a CPU)

"step" is the part of the training step before backward: uint8 samples normalised, the forward
(under torch.autocast("cpu", dtype=torch.bfloat16) in bf16), the loss on float32 logits; backward
then runs the graph inductor compiled for it, and the optimizer step stays eager (fused where
torch has a fused CPU kernel for it: one pass over each parameter, the same update). A compiled
configuration's first step (tracing, compiling forward and backward, autotuning) is timed apart,
as compile_s, then `warmup` further steps run before the timed window.

Each configuration prints one key=value line; one that fails (no torch.compile in the Python at
hand, an inductor error, ...) prints its error=... instead and the next one runs.
"""
import sys
import time
import traceback

import torch

BASES = ("eager", "compile-default", "compile-max-autotune")
CHANNELS_LAST = "-channels-last"


def default_configs(conv):
    """The configurations measured when --configs is not given."""
    if conv:
        return ["eager", "eager-channels-last", "compile-default", "compile-max-autotune"]
    return ["eager", "compile-default", "compile-max-autotune"]


def parse_config(name, conv):
    """(base, channels_last) of a configuration name; ValueError for an unknown one."""
    channels_last = name.endswith(CHANNELS_LAST)
    base = name[: -len(CHANNELS_LAST)] if channels_last else name
    if base not in BASES:
        raise ValueError(f"unknown configuration {name!r} (known: {', '.join(BASES)}, each "
                         f"optionally with {CHANNELS_LAST} for a conv net)")
    if channels_last and not conv:
        raise ValueError(f"{name}: channels_last applies to conv nets only")
    return base, channels_last


def config_list(text, conv):
    """The --configs argument (comma-separated, "all": the defaults) as a list of names."""
    if not text or text == "all":
        return default_configs(conv)
    names = [c for c in text.split(",") if c]
    for name in names:
        parse_config(name, conv)
    return names


def make_optimizer(kind, params, **kwargs):
    """kind(params, **kwargs) (a torch.optim class) with fused=True where this torch has a fused
    CPU kernel for it (the same update in one pass), else its default implementation; returns
    (optimizer, "fused" or "default")."""
    params = list(params)
    try:
        return kind(params, fused=True, **kwargs), "fused"
    except (TypeError, RuntimeError, ValueError):  # torch 1.13: no fused SGD; no fused CPU kernel
        return kind(params, **kwargs), "default"


def error_word(error):
    """An exception as one key=value word: its type and first line, no spaces or '='."""
    first = (str(error).strip().splitlines() or [""])[0][:160]
    text = f"{type(error).__name__}:{first}" if first else type(error).__name__
    return "".join("_" if c.isspace() or c == "=" else c for c in text)


def measure(config, conv, seconds, warmup, check_every, build):
    """Measures one configuration. build(channels_last) returns (forward_loss, after_backward,
    batches, info): forward_loss(samples, labels) -> loss (normalisation, autocast, forward,
    loss), after_backward() clips and steps the optimizer, batches a list of (samples, labels)
    cycled through, info a dict of key=value fields for the line. Returns the measured fields;
    raises what the configuration raised."""
    base, channels_last = parse_config(config, conv)
    forward_loss, after_backward, batches, info = build(channels_last)
    if base != "eager":
        if not hasattr(torch, "compile"):
            raise RuntimeError(f"torch {torch.__version__} has no torch.compile")
        torch._dynamo.reset()
        mode = base[len("compile-"):]
        forward_loss = torch.compile(forward_loss, mode=None if mode == "default" else mode)

    def step(i):
        samples, labels = batches[i % len(batches)]
        loss = forward_loss(samples, labels)
        loss.backward()
        after_backward()
        return loss

    fields = dict(info)
    if base != "eager":
        start = time.perf_counter()
        step(0)
        fields["compile_s"] = f"{time.perf_counter() - start:.2f}"
        warmup = max(warmup, 2)
    for i in range(warmup):
        step(i)
    steps, start = 0, time.perf_counter()
    while True:
        for _ in range(check_every):
            loss = step(steps)
            steps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and steps >= 3:
            break
    fields.update(steps=steps, step_ms=f"{1000 * elapsed / steps:.3f}",
                  last_loss=f"{loss.item():.4f}")
    return fields, elapsed / steps


def run(configs, conv, head, seconds, warmup, check_every, build, tail):
    """Measures each configuration in turn and prints its line: `head` (the kind and the fields
    that name the row), config=..., torch=..., then what measure() and tail(step_seconds) give, or
    error=... when it fails. Returns the number of configurations that failed."""
    failed = 0
    for config in configs:
        prefix = f"{head} config={config} torch={torch.__version__}"
        try:
            fields, step_seconds = measure(config, conv, seconds, warmup, check_every, build)
        except Exception as error:  # a configuration this torch cannot run: reported, skipped
            failed += 1
            traceback.print_exc(file=sys.stderr)
            print(f"{prefix} error={error_word(error)}", flush=True)
            continue
        fields.update(tail(step_seconds))
        print(prefix + "".join(f" {k}={v}" for k, v in fields.items()), flush=True)
    return failed
