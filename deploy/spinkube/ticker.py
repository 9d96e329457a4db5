#!/usr/bin/env python3
"""leasegate's ticker: ticks the timer functions' HTTP routes on schedules, on every replica.

SpinKube's shim runs no cron trigger, so on SpinKube the timer functions are ticked over HTTP
(`POST /api/leader/tick`, `POST /api/jobs/{job}/tick`, ...; bearer `timer_token`). A Kubernetes
CronJob fires at most once a minute, too coarse for the leader's 10 s ticks; this one small
process ticks at second granularity. It ticks **every ready pod** (every address the headless
Service's name resolves to), each pod with its own `instance_id`, as Spin's cron trigger would
tick every instance: the lease decides which pod acts (one job run per occurrence, one leader).

Environment (stdlib only; Python 3.9 or later):
  LEASEGATE_TICK_TARGETS  comma-separated host:port; every address of each host is ticked
                          (in the cluster: the headless Service, `leasegate-pods:80`)
  LEASEGATE_TIMER_TOKEN   the app's timer_token
  LEASEGATE_TICKS         one tick per line: `PERIOD[+OFFSET] PATH`, in seconds since the Unix
                          epoch (UTC): `10 /api/leader/tick`, `60+30 /api/init/example-init`
  LEASEGATE_TICK_TIMEOUT  seconds one tick's request may take (default 120: a job tick waits
                          for the job, up to job_timeout_seconds)
  LEASEGATE_TICK_ONCE     when set, fire every tick once now and exit (a manual check)

A job tick (`/api/jobs/...`, or `/api/jobs`: every job of a `jobs` table that is due, ticked at
the finest cadence the jobs need, e.g. `5 /api/jobs`) carries its scheduled time, `{"at": "..."}`, so every pod ticks the
same occurrence; the other routes take no body. One JSON line per request goes to stdout.
Ticks run in their own threads: a long job run never delays the next leader tick. Running two
tickers is safe (each occurrence still runs once), only wasteful.
"""
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

# Serializes the event lines threads print.
OUTPUT = threading.Lock()


def parse_ticks(text):
    """[(period, offset, path)] from `PERIOD[+OFFSET] PATH` lines; blank lines and # comments skipped."""
    ticks = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        when, path = line.split()
        period, _, offset = when.partition("+")
        period, offset = int(period), int(offset or 0)
        if period < 1 or not 0 <= offset < period or not path.startswith("/"):
            raise ValueError(f"bad tick line {line!r}: PERIOD[+OFFSET] /path, 0 <= OFFSET < PERIOD")
        ticks.append((period, offset, path))
    if not ticks:
        raise ValueError("LEASEGATE_TICKS names no tick")
    return ticks


def next_due(period, offset, now):
    """The first scheduled second after `now` (seconds since the epoch)."""
    return ((int(now) - offset) // period + 1) * period + offset


def addresses(targets):
    """Every (address, port) the targets resolve to now (the pods ready at this moment)."""
    found = []
    for target in targets:
        host, _, port = target.rpartition(":")
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as e:
            log({"event": "resolve_failed", "target": target, "error": str(e)})
            continue
        for info in infos:
            addr = (info[4][0], int(port))
            if addr not in found:
                found.append(addr)
    return found


def log(record):
    # One line per event, whole: ticks log from their own threads, and print() writes the text
    # and the newline apart, so two threads' lines could interleave without the lock.
    with OUTPUT:
        print(json.dumps(record), flush=True)


def tick(address, port, path, at, token, timeout):
    host = f"[{address}]" if ":" in address else address
    body = b""
    if path == "/api/jobs" or path.startswith("/api/jobs/"):
        body = json.dumps({"at": datetime.fromtimestamp(at, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}).encode()
    request = urllib.request.Request(
        f"http://{host}:{port}{path}", data=body, method="POST",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    started = time.monotonic()
    record = {"event": "tick", "path": path, "address": address, "port": port, "at": at}
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            record["status"] = answer.status
            record["answer"] = answer.read(4096).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        record["status"] = e.code
        record["answer"] = e.read(4096).decode("utf-8", "replace")
    except OSError as e:
        record["status"] = 0
        record["error"] = str(e)
    record["ms"] = round((time.monotonic() - started) * 1000)
    log(record)


def fire(path, at, targets, token, timeout):
    for address, port in addresses(targets):
        threading.Thread(target=tick, args=(address, port, path, at, token, timeout), daemon=True).start()


def main():
    targets = [t.strip() for t in os.environ.get("LEASEGATE_TICK_TARGETS", "").split(",") if t.strip()]
    token = os.environ.get("LEASEGATE_TIMER_TOKEN", "")
    if not targets or not token:
        print("ticker: set LEASEGATE_TICK_TARGETS (host:port,...) and LEASEGATE_TIMER_TOKEN", file=sys.stderr)
        return 2
    ticks = parse_ticks(os.environ.get("LEASEGATE_TICKS", ""))
    timeout = float(os.environ.get("LEASEGATE_TICK_TIMEOUT", "120"))
    log({"event": "start", "targets": targets, "ticks": [f"{p}+{o} {path}" for p, o, path in ticks]})
    if os.environ.get("LEASEGATE_TICK_ONCE"):
        now = int(time.time())
        for _, _, path in ticks:
            fire(path, now, targets, token, timeout)
        deadline = time.monotonic() + timeout
        while threading.active_count() > 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        return 0
    last = 0
    while True:
        # From the last second fired at least: a sleep that wakes early never fires one twice.
        now = max(time.time(), last)
        due = last = min(next_due(p, o, now) for p, o, _ in ticks)
        time.sleep(max(0.0, due - time.time()))
        for period, offset, path in ticks:
            if (due - offset) % period == 0:
                fire(path, due, targets, token, timeout)


if __name__ == "__main__":
    sys.exit(main())
