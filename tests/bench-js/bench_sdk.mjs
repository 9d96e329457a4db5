// The Azure SDK for JavaScript's rows of `scripts/dev.sh bench`.
//
// Acquires blob leases with `@azure/storage-blob` (the version package-lock.json pins) the way
// scripts/bench_sdk.py does with the Python SDK: `concurrency` loops at once (Node runs them on
// its one event loop, as a Node service would), one `BlobClient` and one blob per loop, for a
// fixed time after a short warm-up; the figures are printed as one JSON document on stdout
// (progress on stderr), in bench_sdk.py's shape. Two cases, each at every concurrency:
//
// * granted: acquiring again with the id that holds the lease (storage answers 201);
// * refused: acquiring with another id (409 LeaseAlreadyPresent).
//
// The connection string comes from the environment (LEASEGATE_BENCH_CONNECTION_STRING) and is
// never printed. Nothing is fetched at run time: the SDK is installed beside this file by
// scripts/dev.sh bench (npm ci). No figure is asserted: answers other than the expected one are
// counted and a few are shown, as errors.

import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { parseArgs } from "node:util";
import { performance } from "node:perf_hooks";
import { BlobClient } from "@azure/storage-blob";

const SAMPLES = 3;

/** Nearest-rank percentile of an ascending list (the Rust side uses the same rule). */
function percentile(ordered, perMille) {
  if (ordered.length === 0) return null;
  const rank = Math.max(1, Math.ceil((perMille * ordered.length) / 1000));
  return ordered[rank - 1];
}

/** One Lease Acquire; returns [status, detail]. */
async function acquireOnce(lease) {
  try {
    const r = await lease.acquireLease(-1);
    return [r._response.status, null];
  } catch (e) {
    if (typeof e.statusCode === "number") return [e.statusCode, e.code ?? null];
    // A broken connection, a timeout: an error, never a decision.
    return [null, e.name ?? "Error"];
  }
}

async function runCell(conn, container, blobs, leaseId, expected, concurrency, warmup, seconds) {
  const leases = [];
  for (let i = 0; i < concurrency; i++) {
    leases.push(new BlobClient(conn, container, blobs[i]).getBlobLeaseClient(leaseId));
  }
  const start = performance.now() + warmup * 1000;
  const end = start + seconds * 1000;
  const worker = async (i) => {
    const latencies = [];
    let unexpected = 0;
    const samples = [];
    for (;;) {
      const began = performance.now();
      if (began >= end) break;
      const [status, detail] = await acquireOnce(leases[i]);
      const took = performance.now() - began;
      if (began < start) continue;
      if (status === expected[0] && detail === expected[1]) {
        latencies.push(took);
      } else {
        unexpected += 1;
        if (samples.length < SAMPLES) samples.push(`status ${status}: ${detail}`);
      }
    }
    return { latencies, unexpected, samples };
  };
  const results = await Promise.all(leases.map((_, i) => worker(i)));
  const latencies = results.flatMap((r) => r.latencies).sort((a, b) => a - b);
  return {
    decisions: latencies.length,
    seconds,
    p50_ms: percentile(latencies, 500),
    p90_ms: percentile(latencies, 900),
    p99_ms: percentile(latencies, 990),
    unexpected: results.reduce((n, r) => n + r.unexpected, 0),
    samples: results.flatMap((r) => r.samples).slice(0, SAMPLES),
  };
}

function installedVersion(name) {
  const require = createRequire(import.meta.url);
  const path = require.resolve(`${name}/package.json`);
  return JSON.parse(readFileSync(path, "utf8")).version;
}

async function main() {
  const { values } = parseArgs({
    options: {
      container: { type: "string" },
      blobs: { type: "string" },
      holder: { type: "string" },
      other: { type: "string" },
      concurrency: { type: "string", default: "1,4,16" },
      warmup: { type: "string", default: "0.5" },
      seconds: { type: "string", default: "2.5" },
    },
  });
  for (const k of ["container", "blobs", "holder", "other"]) {
    if (!values[k]) throw new Error(`--${k} is required`);
  }
  const conn = process.env.LEASEGATE_BENCH_CONNECTION_STRING;
  if (!conn) throw new Error("LEASEGATE_BENCH_CONNECTION_STRING is not set");
  const blobs = values.blobs.split(",");
  const levels = values.concurrency.split(",").map(Number);
  const warmup = Number(values.warmup);
  const seconds = Number(values.seconds);
  if (Math.max(...levels) > blobs.length) {
    throw new Error(`${blobs.length} blobs for up to ${Math.max(...levels)} loops`);
  }
  const cases = [
    ["granted", values.holder, [201, null]],
    ["refused", values.other, [409, "LeaseAlreadyPresent"]],
  ];
  const cells = [];
  for (const [name, leaseId, expected] of cases) {
    for (const c of levels) {
      const cell = await runCell(conn, values.container, blobs, leaseId, expected, c, warmup, seconds);
      cell.case = name;
      cell.concurrency = c;
      cells.push(cell);
      process.stderr.write(
        `bench: js sdk acquire ${name} c=${c}: ${(cell.decisions / seconds).toFixed(0)}/s ` +
          `p50 ${(cell.p50_ms ?? 0).toFixed(2)} ms p99 ${(cell.p99_ms ?? 0).toFixed(2)} ms, ` +
          `${cell.unexpected} errors\n`,
      );
    }
  }
  process.stdout.write(
    JSON.stringify({
      sdk: `@azure/storage-blob ${installedVersion("@azure/storage-blob")}`,
      core: `@azure/core-rest-pipeline ${installedVersion("@azure/core-rest-pipeline")}`,
      node: process.version,
      cells,
    }) + "\n",
  );
}

main().catch((e) => {
  process.stderr.write(`bench_sdk.mjs: ${e.message}\n`);
  process.exit(1);
});
