#!/usr/bin/env python3
"""The Azure SDK for Python's rows of `scripts/dev.sh bench`.

Acquires blob leases with `azure-storage-blob` (the version the bench pins) from threads, one
`BlobClient` (so one keep-alive connection) per thread and one blob per thread, for a fixed time
after a short warm-up, and prints the figures as one JSON document on stdout (progress on
stderr). Two cases, each at every concurrency:

* granted: acquiring again with the id that holds the lease (storage answers 201);
* refused: acquiring with another id (409 LeaseAlreadyPresent).

The connection string comes from the environment (LEASEGATE_BENCH_CONNECTION_STRING) and is
never printed. No figure is asserted: answers other than the expected one are counted and a few
are shown, as errors.
"""

import argparse
import json
import os
import platform
import sys
import threading
import time
from importlib.metadata import version

# The SDK, imported by main() once the arguments are read (so that --help needs no SDK).
HttpResponseError = BlobClient = BlobLeaseClient = None

SAMPLES = 3


def percentile(ordered, per_mille):
    """Nearest-rank percentile of an ascending list (the Rust side uses the same rule)."""
    if not ordered:
        return None
    rank = max(1, -(-per_mille * len(ordered) // 1000))
    return ordered[rank - 1]


def acquire_once(lease):
    """One Lease Acquire; returns (status, detail)."""
    try:
        # The SDK raises on any status but 201 (its generated code expects exactly 201).
        lease.acquire(lease_duration=-1)
        return 201, None
    except HttpResponseError as e:
        return e.status_code, e.error_code
    except Exception as e:  # a broken connection, a timeout: an error, never a decision
        return None, type(e).__name__


def run_cell(conn, container, blobs, lease_id, expected, concurrency, warmup, seconds):
    leases = [
        BlobLeaseClient(BlobClient.from_connection_string(conn, container, blobs[i]), lease_id)
        for i in range(concurrency)
    ]
    barrier = threading.Barrier(concurrency)
    results = [None] * concurrency

    def worker(i):
        latencies, unexpected, samples = [], 0, []
        barrier.wait()
        start = time.perf_counter() + warmup
        end = start + seconds
        while True:
            began = time.perf_counter()
            if began >= end:
                break
            status, detail = acquire_once(leases[i])
            took = time.perf_counter() - began
            if began < start:
                continue
            if (status, detail) == expected:
                latencies.append(took)
            else:
                unexpected += 1
                if len(samples) < SAMPLES:
                    samples.append(f"status {status}: {detail}")
        results[i] = (latencies, unexpected, samples)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    latencies = sorted(x for r in results for x in r[0])
    p50, p90, p99 = (percentile(latencies, k) for k in (500, 900, 990))
    return {
        "decisions": len(latencies),
        "seconds": seconds,
        "p50_ms": None if p50 is None else p50 * 1000,
        "p90_ms": None if p90 is None else p90 * 1000,
        "p99_ms": None if p99 is None else p99 * 1000,
        "unexpected": sum(r[1] for r in results),
        "samples": [s for r in results for s in r[2]][:SAMPLES],
    }


def main():
    global HttpResponseError, BlobClient, BlobLeaseClient
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] + " It writes no file: the figures go to stdout.")
    p.add_argument("--container", required=True)
    p.add_argument("--blobs", required=True, help="comma-separated, one per thread")
    p.add_argument("--holder", required=True, help="the lease id that holds every blob")
    p.add_argument("--other", required=True, help="a lease id that holds none")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--seconds", type=float, default=2.5)
    args = p.parse_args()
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import BlobClient, BlobLeaseClient
    conn = os.environ.get("LEASEGATE_BENCH_CONNECTION_STRING")
    if not conn:
        sys.exit("LEASEGATE_BENCH_CONNECTION_STRING is not set")
    blobs = args.blobs.split(",")
    levels = [int(c) for c in args.concurrency.split(",")]
    if max(levels) > len(blobs):
        sys.exit(f"{len(blobs)} blobs for up to {max(levels)} threads")
    cases = [
        ("granted", args.holder, (201, None)),
        ("refused", args.other, (409, "LeaseAlreadyPresent")),
    ]
    cells = []
    for case, lease_id, expected in cases:
        for c in levels:
            cell = run_cell(conn, args.container, blobs, lease_id, expected, c, args.warmup,
                            args.seconds)
            cell.update(case=case, concurrency=c)
            cells.append(cell)
            p50 = cell["p50_ms"] or 0.0
            p99 = cell["p99_ms"] or 0.0
            print(f"bench: sdk acquire {case} c={c}: {cell['decisions'] / args.seconds:.0f}/s "
                  f"p50 {p50:.2f} ms p99 {p99:.2f} ms, {cell['unexpected']} errors",
                  file=sys.stderr, flush=True)
    json.dump({
        "sdk": f"azure-storage-blob {version('azure-storage-blob')}",
        "core": f"azure-core {version('azure-core')}",
        "python": platform.python_version(),
        "cells": cells,
    }, sys.stdout)
    print()


if __name__ == "__main__":
    main()
