#!/usr/bin/env python3
"""Writes every application variable of a Spin manifest to one file, for
`spin up --variable @FILE.toml`: each variable's value from NAME=VALUE arguments, else from
SPIN_VARIABLE_NAME in the environment, else its default in the manifest.

Why: Spin answers a variable read by asking its providers in turn, `--variable` values first.
A read that reaches its environment provider (SPIN_VARIABLE_*, then .env) costs a thread
handover inside Spin, about 30 us each on a 2-core machine, found or not; `--variable` values
answer from memory. A variable with no value here (required, not given) is left out, for Spin
to report. docs/configuration.md ("Variables from memory") says more.

    python3 scripts/variables.py -o .spin/variables.toml storage_account=myaccount ...
    spin up --variable @.spin/variables.toml

The file holds secrets: it is written with mode 0600, and values never reach this script's
output (`-o -` prints the file to stdout, for a pipe to a secret store).
"""

import argparse
import json
import os
import sys
import tomllib


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML escapes too."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Write every variable of a Spin manifest for `spin up --variable @FILE`."
    )
    parser.add_argument("-f", "--manifest", default="spin.toml", help="default: spin.toml")
    parser.add_argument("-o", "--output", required=True, help="the file to write, or - for stdout")
    parser.add_argument("values", nargs="*", metavar="NAME=VALUE")
    args = parser.parse_args()

    try:
        with open(args.manifest, "rb") as f:
            declared = tomllib.load(f).get("variables", {})
    except (OSError, tomllib.TOMLDecodeError) as e:
        print(f"variables.py: cannot read {args.manifest}: {e}", file=sys.stderr)
        return 2
    given = {}
    for item in args.values:
        name, sep, value = item.partition("=")
        if not sep or name not in declared:
            print(
                f"variables.py: '{name}' is not a variable of {args.manifest}"
                if sep
                else f"variables.py: '{name}' is not NAME=VALUE",
                file=sys.stderr,
            )
            return 2
        given[name] = value

    lines, missing = [], []
    for name, spec in declared.items():
        value = given.get(name)
        if value is None:
            value = os.environ.get(f"SPIN_VARIABLE_{name.upper()}")
        if value is None and isinstance(spec, dict):
            value = spec.get("default")
        if value is None:
            missing.append(name)
            continue
        lines.append(f"{name} = {toml_string(str(value))}\n")
    text = "".join(lines)

    if args.output == "-":
        sys.stdout.write(text)
    else:
        fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"variables.py: {len(lines)} variables written to {args.output}", file=sys.stderr)
    if missing:
        print(
            f"variables.py: no value for {', '.join(missing)} (required: give NAME=VALUE)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
