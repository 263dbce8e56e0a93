#!/usr/bin/python3
"""Sums oneDNN's per-primitive execution times (ONEDNN_VERBOSE=1: oneDNN 2.6 prints one "exec"
line per primitive run with its time in ms; 3.x spells it ONEDNN_VERBOSE=profile) by primitive
kind, propagation and implementation, and prints the tables docs/profile-vision.md shows.

    ONEDNN_VERBOSE=1 build/bench/vision_bench --job JOB.yaml --precision bf16 \\
        --seconds 0 --warmup 1 > verbose.log      # 1 warm-up + 3 timed steps
    bench/onednn_profile.py verbose.log [--steps N] [--top 25]

--steps N divides the sums by N (the timed steps plus warm-up ones that the log holds) to give
milliseconds per step. Lines other than "exec" lines (creation, info) are ignored.
"""
import argparse
import collections


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log")
    parser.add_argument("--steps", type=int, default=0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    by_kind = collections.defaultdict(float)
    by_shape = collections.defaultdict(lambda: [0.0, 0])
    total = 0.0
    for line in open(args.log, errors="replace"):
        fields = line.rstrip("\n").split(",")
        if len(fields) < 11 or fields[1] != "exec" or not fields[0].endswith("_verbose"):
            continue
        try:
            ms = float(fields[-1])
        except ValueError:
            continue
        kind, impl, prop, formats, problem = (fields[3], fields[4], fields[5], fields[6],
                                              fields[-2])
        total += ms
        by_kind[(kind, prop, impl)] += ms
        entry = by_shape[(kind, prop, impl, formats, problem)]
        entry[0] += ms
        entry[1] += 1
    per = args.steps if args.steps > 0 else 1
    unit = "ms/step" if args.steps > 0 else "ms"
    print(f"total {total / per:.1f} {unit} in oneDNN primitives")
    print()
    print(f"| primitive | propagation | implementation | {unit} | share |")
    print("|---|---|---|---|---|")
    for (kind, prop, impl), ms in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"| {kind} | {prop} | {impl} | {ms / per:.2f} | {100 * ms / total:.1f}% |")
    print()
    print(f"| primitive | propagation | implementation | formats | problem | calls | {unit} |")
    print("|---|---|---|---|---|---|---|")
    top = sorted(by_shape.items(), key=lambda kv: -kv[1][0])[: args.top]
    for (kind, prop, impl, formats, problem), (ms, calls) in top:
        print(f"| {kind} | {prop} | {impl} | {formats} | {problem} | {calls} | {ms / per:.2f} |")


if __name__ == "__main__":
    main()
