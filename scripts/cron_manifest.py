#!/usr/bin/env python3
"""Writes spin-cron.toml, the timer functions on Spin's cron trigger, from spin.toml: the same
[variables] and component definitions, plus the [[trigger.cron]] schedules below. Run it after
changing a timer component or a variable in spin.toml (tests/tests/deploy/ checks that the
tracked spin-cron.toml is what it writes):

    python3 scripts/cron_manifest.py -o spin-cron.toml

It writes only the file given with -o (- prints it to stdout), and says on stderr what it wrote.
"""
import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (component, cron expression "sec min hour dom mon dow", why); scheduled-job's is derived
# from its schedule in spin.toml (job_trigger below).
SCHEDULES = [
    ("scheduled-job", None, None),
    ("leader", "*/10 * * * * *", "every 10 s, well inside the 30 s leader lease"),
    ("init-once", "30 * * * * *", "every minute until it is done (then a tick is one storage read)"),
    ("ttl-sweeper", "15 */5 * * * *", "every 5 minutes, one time budget of sweeping per worker"),
]

HEADER = '''spin_manifest_version = 2

# The timer functions on Spin's cron trigger. Spin refuses a manifest that names a trigger
# whose plugin is missing, so this app is apart from spin.toml (the HTTP app, which runs on any
# Spin). Install the plugin once (the version pinned here is the one verified), then run both
# apps side by side, each instance with its own instance_id and --state-dir:
#
#   spin plugins update && spin plugins install trigger-cron --version 0.5.0
#   spin up -f spin-cron.toml --state-dir .spin/timers --variable instance_id=node-a --variable timer_token=...
#
# The plugin's source: https://github.com/spinframework/spin-trigger-plugins (crates/trigger-cron;
# it moved there from spin-trigger-cron). 0.5.0 runs these components (their synchronous
# fermyon:spin-cron@2.0.0 export); 0.6.x has the same interface (spin:cron@3.0.0) and is
# expected to run them, unverified here. SpinKube's shim runs no cron trigger: there the timer
# functions are ticked over HTTP (deploy/spinkube/ticker.yaml), and this manifest is not used.
#
# Generated from spin.toml by `python3 scripts/cron_manifest.py -o spin-cron.toml`: components
# and variables are the same (tests/tests/deploy/ keeps them equal).

[application]
name = "leasegate-timers"
version = "0.1.0"
description = "leasegate's timer functions on Spin's cron trigger."

'''


def default(text: str, name: str) -> str:
    """A variable's default in spin.toml's [variables] ("" when empty or absent)."""
    for line in text.splitlines():
        if line.startswith(f"{name} = "):
            return line.split('default = "', 1)[1].split('"', 1)[0] if 'default = "' in line else ""
    return ""


def job_trigger(text: str, jobs: str = "") -> tuple[str, str]:
    """The cron trigger for scheduled-job: for the `jobs` table (`jobs`, else spin.toml's
    default), the finest cadence any job needs (table_trigger); else for the one job's
    default schedule (trigger)."""
    jobs = jobs or default(text, "jobs")
    if jobs.strip():
        return table_trigger(text, jobs)
    return trigger(default(text, "job_schedule"), default(text, "job_time_zone") or "UTC",
                   int(default(text, "job_period_seconds") or "60"))


def trigger(expression: str, zone: str, period: int) -> tuple[str, str]:
    """The cron trigger for one schedule: a tick on each occurrence (the job's own expression
    when it is in UTC, as 6 fields), every minute at the job's seconds for a zoned expression
    (the trigger's times are UTC, zones are whole minutes off it; the job's schedule decides),
    every period for an interval (every minute when the period is not a divisor of a
    minute)."""
    if expression:
        fields = expression.split()
        if zone == "UTC" and len(fields) in (5, 6) and not expression.startswith("@"):
            six = expression if len(fields) == 6 else "0 " + expression
            return six, f"on each occurrence of the job's schedule ({expression}, UTC)"
        if len(fields) == 6 and field_set(fields[0], 60) is not None:
            return (f"{fields[0]} * * * * *",
                    f"every minute at the job's seconds: its schedule ({expression}, {zone}) "
                    "decides")
        return "0 * * * * *", f"every minute: the job's schedule ({expression}, {zone}) decides"
    if period < 60 and 60 % period == 0:
        return f"*/{period} * * * * *", f"every {period} s, the job's period"
    return "0 * * * * *", f"every minute at second 0, the job's period ({period} s) or finer"


def field_set(field: str, size: int) -> set[int] | None:
    """The values a cron field of `size` values (60 seconds or minutes) takes; None when it is
    not plain numbers, ranges, lists and steps."""
    values: set[int] = set()
    for part in field.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            low, high = 0, size - 1
        elif "-" in base:
            a, _, b = base.partition("-")
            if not (a.isdigit() and b.isdigit()):
                return None
            low, high = int(a), int(b)
        elif base.isdigit():
            low = high = int(base)
            if step:
                high = size - 1
        else:
            return None
        if step and not step.isdigit() or step == "0" or high >= size or low > high:
            return None
        values.update(range(low, high + 1, int(step or "1")))
    return values


def render(values: set[int] | None, size: int) -> str:
    """A set of seconds or minutes as a cron field: `*`, `*/k` or a list."""
    if values is None or len(values) == size:
        return "*"
    ordered = sorted(values)
    for k in range(2, size):
        if size % k == 0 and values == set(range(0, size, k)):
            return f"*/{k}"
    return ",".join(str(v) for v in ordered)


class TableError(Exception):
    """A job of the `jobs` table whose keys cannot give a trigger."""


def whole(name: str, key: str, value) -> int:
    """A key of job `name` that must be a whole number of seconds."""
    try:
        number = int(str(value))
    except ValueError:
        raise TableError(f"job {name}: key {key} must be a whole number of seconds, not "
                         f"{value!r}") from None
    least = 1 if key == "period_seconds" else 0
    if number < least:
        raise TableError(f"job {name}: key {key} must be at least {least}")
    return number


def table_trigger(text: str, jobs: str) -> tuple[str, str]:
    """The finest cadence the jobs of the table need: a superset of every job's occurrence
    times, the union of their triggers' second and minute fields, every hour of every day."""
    import tomllib
    table = tomllib.loads(jobs)
    seconds: set[int] | None = set()
    minutes: set[int] | None = set()
    for name, keys in table.items():
        keys = keys if isinstance(keys, dict) else {}
        interval = "period_seconds" in keys or "offset_seconds" in keys
        expression = str(keys.get("schedule", "" if interval else default(text, "job_schedule")))
        zone = str(keys.get("time_zone", "" if interval else default(text, "job_time_zone")))
        period = keys.get("period_seconds", None if "schedule" in keys else
                          default(text, "job_period_seconds"))
        if expression:
            six, _ = trigger(expression, zone or "UTC", 60)
            second, minute = six.split()[:2]
            s, m = field_set(second, 60), field_set(minute, 60)
        else:
            # Occurrences at offset + k x period: every gcd(period, 60) s from the offset.
            step = math.gcd(whole(name, "period_seconds", period or 60), 60)
            offset = whole(name, "offset_seconds",
                           keys.get("offset_seconds", default(text, "job_offset_seconds") or 0))
            s, m = {(offset + i) % 60 for i in range(0, 60, step)}, set(range(60))
        seconds = None if s is None or seconds is None else seconds | s
        minutes = None if m is None or minutes is None else minutes | m
    six = f"{render(seconds, 60)} {render(minutes, 60)} * * * *"
    return six, f"the finest cadence the {len(table)} jobs of the jobs table need"


def manifest(main_text: str, jobs: str = "") -> tuple[str, int]:
    """The cron manifest for the HTTP manifest `main_text` (and the `jobs` table), and its
    number of triggers."""
    schedules = []
    for component, expression, why in SCHEDULES:
        if expression is None:
            expression, why = job_trigger(main_text, jobs)
        schedules.append((component, expression, why))
    variables = main_text[main_text.index("[variables]"):main_text.index("[[trigger.http]]")]
    parts = [HEADER, variables]
    for component, expression, why in schedules:
        parts.append(f'# {component}: {why}.\n[[trigger.cron]]\ncomponent = "{component}"\n'
                     f'cron_expression = "{expression}"\n\n')
    for component, _, _ in SCHEDULES:
        start = main_text.index(f"[component.{component}]")
        end = main_text.find("\n[[trigger", start)
        block = main_text[start:] if end < 0 else main_text[start:end + 1]
        parts.append(block.rstrip("\n") + "\n\n")
    return "".join(parts).rstrip("\n") + "\n", len(schedules)


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Write the cron-trigger manifest of leasegate's timer functions from spin.toml.",
        epilog="example: python3 scripts/cron_manifest.py -o spin-cron.toml "
               "(with many jobs: --jobs jobs.toml)",
    )
    parser.add_argument("-f", "--manifest", default=str(ROOT / "spin.toml"),
                        help="the HTTP manifest to read (default: spin.toml beside scripts/)")
    parser.add_argument("-o", "--output", required=True,
                        help="the file to write (spin-cron.toml), or - for stdout")
    parser.add_argument("--jobs", help="the jobs table (TOML, as passed with --variable "
                        "jobs=@FILE): scheduled-job's trigger is the finest cadence its jobs need")
    args = parser.parse_args()
    try:
        main_text = Path(args.manifest).read_text()
        jobs = Path(args.jobs).read_text() if args.jobs else ""
    except OSError as e:
        print(f"cron_manifest.py: cannot read {e.filename}: {e.strerror}", file=sys.stderr)
        return 1
    try:
        import tomllib
        if jobs:
            tomllib.loads(jobs)
    except tomllib.TOMLDecodeError as e:
        print(f"cron_manifest.py: {args.jobs} is not TOML: {e}", file=sys.stderr)
        return 1
    try:
        text, triggers = manifest(main_text, jobs)
    except TableError as e:
        print(f"cron_manifest.py: {args.jobs}: {e}", file=sys.stderr)
        return 1
    except ValueError:
        print(f"cron_manifest.py: {args.manifest} lacks [variables], [[trigger.http]] or a timer "
              "component", file=sys.stderr)
        return 1
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    try:
        Path(args.output).write_text(text)
    except OSError as e:
        print(f"cron_manifest.py: cannot write {args.output}: {e.strerror}", file=sys.stderr)
        return 1
    print(f"cron_manifest.py: wrote {args.output} ({triggers} cron triggers)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
