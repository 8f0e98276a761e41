"""Before and after (issue 29, "no regression beyond 5%"): the same ingest
and query load on two `mira` binaries, alternating, in one run.

Each round starts a fresh `mira serve` of one binary, then runs one
window of noisy_neighbour.py's calm load (two tenants, each `mira loadgen`
over OTLP/gRPC with 2 connections and batches of 1,000 log records, and
each looping a Loki log query, a LogQL metric query and a PromQL query
over the last 5 minutes), and stops it; the binaries take turns (A B B A
A B ...), so drift in the machine's speed falls on both. Prints each
round, then the after/before ratios of the mean ingest rate and of the
median query p50 and p99.

Usage: python3 before_after.py BEFORE_BIN AFTER_BIN [SECONDS] [ROUNDS]
"""
import statistics
import sys

import noisy_neighbour as nn


def one(binary, seconds):
    nn.BIN, nn.DUR = binary, seconds
    proc, q, http, grpc = nn.serve()
    try:
        nn.loadgen(grpc, "calm-a", 3)  # warm-up
        rate, p50, p99, errors, _ = nn.window(q, http, grpc, False)
        return rate, p50, p99, dict(errors)
    finally:
        proc.kill()
        proc.wait()


def main():
    before, after = sys.argv[1], sys.argv[2]
    seconds = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    got = {"before": [], "after": []}
    order = []
    for r in range(rounds):
        order += [("before", before), ("after", after)] if r % 2 == 0 else [("after", after), ("before", before)]
    for i, (name, binary) in enumerate(order):
        rate, p50, p99, errors = one(binary, seconds)
        got[name].append((rate, p50, p99))
        print(f"run {i + 1} {name:6}: {rate:9.0f} records/s, query p50 {p50 * 1000:7.1f} ms, "
              f"p99 {p99 * 1000:7.1f} ms, query errors {errors}", flush=True)
    mean = lambda name, k: statistics.mean(x[k] for x in got[name])
    median = lambda name, k: statistics.median(x[k] for x in got[name])
    print(f"after/before: ingest rate {mean('after', 0) / mean('before', 0):.3f}, "
          f"query p50 {median('after', 1) / median('before', 1):.3f}x, "
          f"p99 {median('after', 2) / median('before', 2):.3f}x")


if __name__ == "__main__":
    main()
