#!/usr/bin/env python3
"""The seed library's (stream-velocity) windowing in CPython, the second peer of the
end-to-end comparison (BENCHMARKS.md, "Against Kafka Streams and the seed Python library").

The seed library's approach: per entity, a ring of N time buckets with a running
count and a running float sum over the ring, so that a write and a read are O(1)
(amortised: advancing the ring clears the slots of the buckets that left the window).
This script applies an event sequence written by `velocity-bench seq` to one window
(5m:5s by default), reading the entity's count and sum after every event, and prints
the per-event cost of update+read; cmd/velocity-bench's BenchmarkSeedSequence measures
ours (pkg/window Table.Apply) on the same file.

Faithful to the seed, on purpose: sums are floats (they drift, which our integer sums avoid),
there is no validation, and an old event is written into whatever its ring slot holds.
Fixed, so both sides do the same work: the window holds N buckets, not N-1 (the seed's
eviction off-by-one, which pkg/window's TestLesson3WindowHoldsAllNBuckets keeps out of
ours). Only count and sum are kept (the seed had no min/max); ours computes count, sum,
min and max, i.e. more work per event.

Usage: python3 bench/python/seed_window.py SEQ_FILE [--window-ms 300000 --bucket-ms 5000 --passes 5]
"""

import argparse
import json
import statistics
import struct
import sys
import time


class Ring:
    """One entity's window: N bucket slots, slot = bucket index mod N."""

    __slots__ = ("n", "counts", "sums", "newest", "count", "total")

    def __init__(self, n):
        self.n = n
        self.counts = [0] * n
        self.sums = [0.0] * n
        self.newest = None  # bucket index of the newest event
        self.count = 0
        self.total = 0.0

    def add(self, k, amount):
        newest = self.newest
        if newest is None:
            self.newest = newest = k
        elif k > newest:
            n = self.n
            if k - newest >= n:
                # Every bucket left the window: start over.
                self.counts = [0] * n
                self.sums = [0.0] * n
                self.count = 0
                self.total = 0.0
            else:
                counts, sums = self.counts, self.sums
                for kk in range(newest + 1, k + 1):
                    s = kk % n  # held bucket kk-n, which is now out of the window
                    self.count -= counts[s]
                    self.total -= sums[s]
                    counts[s] = 0
                    sums[s] = 0.0
            self.newest = k
        # An older event (k < newest) goes into slot k mod n whatever that slot holds:
        # the seed's behaviour (the overwrite that pkg/window's TestLesson1 keeps out of
        # ours); the 2 s disorder of the workload stays inside the window, so it never
        # overwrites a live bucket here.
        s = k % self.n
        self.counts[s] += 1
        self.sums[s] += amount
        self.count += 1
        self.total += amount

    def read(self):
        return self.count, self.total


def load(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"VBSEQ001":
        sys.exit(f"{path}: not a velocity-bench sequence file")
    (n,) = struct.unpack_from("<Q", data, 8)
    body = memoryview(data)[16 : 16 + 20 * n]
    if len(body) != 20 * n:
        sys.exit(f"{path}: truncated ({len(body)} of {20 * n} bytes)")
    ids = {}
    events = []
    for e, t, a in struct.iter_unpack("<Iqq", body):
        sid = ids.get(e)
        if sid is None:
            sid = ids[e] = "card-%07d" % e  # same ids as the Kafka workload and the Go side
        events.append((sid, t, a))
    return events


def one_pass(events, window_ms, bucket_ms):
    n = window_ms // bucket_ms
    table = {}
    get = table.get
    sink = 0
    start = time.perf_counter_ns()
    for entity, t, amount in events:
        r = get(entity)
        if r is None:
            r = table[entity] = Ring(n)
        r.add(t // bucket_ms, amount)
        c, s = r.read()
        sink += c
    elapsed = time.perf_counter_ns() - start
    if sink == 0:
        sys.exit("nothing was counted")
    return elapsed / len(events)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("seq")
    ap.add_argument("--window-ms", type=int, default=300_000)
    ap.add_argument("--bucket-ms", type=int, default=5_000)
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    if args.bucket_ms <= 0 or args.window_ms % args.bucket_ms:
        sys.exit("--window-ms must be a positive multiple of --bucket-ms")
    events = load(args.seq)
    per = [one_pass(events, args.window_ms, args.bucket_ms) for _ in range(max(1, min(args.passes, 50)))]
    print(json.dumps({
        "python": sys.version.split()[0],
        "events": len(events),
        "window": f"{args.window_ms}ms:{args.bucket_ms}ms",
        "passes_ns_per_event": [round(x, 1) for x in per],
        "median_ns_per_event": round(statistics.median(per), 1),
    }))


if __name__ == "__main__":
    main()
