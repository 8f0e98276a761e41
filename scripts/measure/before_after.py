"""Before and after (issue 29, "no regression beyond 5%"): the same ingest
and query load on two `mira` binaries, alternating, in one run.

Each round starts a fresh `mira serve` of one binary; loads tenant
`calm-a` with noisy_neighbour.py's steady load for 10 s (`mira loadgen`,
OTLP/gRPC, 2 connections, 5 requests/s of 1,000 log records) and waits
until a query counts every acknowledged record; runs noisy_neighbour.py's
calm queries (one service's newest lines, its lines per level per minute,
a PromQL rate; the last 5 minutes) in a loop for SECONDS (query p50, p99); then
ingests as fast as it is acknowledged for SECONDS (`mira loadgen`, same
shape, no rate: records/s); and stops it. The binaries take turns (A B B
A A B ...), so drift in the machine's speed falls on both. Prints each
round, then the after/before ratios of the mean ingest rate and of the
median query p50 and p99.

Usage: python3 before_after.py BEFORE_BIN AFTER_BIN [SECONDS] [ROUNDS]
"""
import collections
import statistics
import sys
import threading
import time

import noisy_neighbour as nn


def one(binary, seconds):
    nn.BIN = binary
    nn.ACKED.clear()
    proc, q, http, grpc = nn.serve()
    try:
        nn.loadgen(grpc, "calm-a", 10)
        deadline = time.monotonic() + 120
        while nn.counted(q, "calm-a") != nn.ACKED["calm-a"]:
            assert time.monotonic() < deadline, "the acknowledged records were not all counted"
            time.sleep(0.2)
        stop = threading.Event()
        latencies, errors = [], collections.Counter()
        t = threading.Thread(target=nn.calm_queries, args=(q, "calm-a", stop, latencies, errors))
        t.start()
        time.sleep(seconds)
        stop.set()
        t.join()
        lat = sorted(latencies)
        p = lambda x: lat[min(len(lat) - 1, int(x * len(lat)))]
        rate = nn.loadgen(grpc, "bench", seconds, rate=0)
        return rate, p(0.5), p(0.99), dict(errors)
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
