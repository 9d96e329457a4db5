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

Give secrets through the environment (SPIN_VARIABLE_STORAGE_KEY=... python3 ...), not as
arguments, which other users of the machine can see. The file holds secrets: it is written
with mode 0600 (a new file, renamed into place), and no value reaches this script's messages
(`-o -` prints the file to stdout, for a pipe to a secret store). A .env file in the current
folder, which Spin's environment provider also reads, is refused for the variables it sets:
export them or give them as arguments. Values a launcher sets at each start (instance_id on
Azure Functions, say) would be pinned by the file: do not use it there.
"""

import argparse
import json
import os
import re
import sys
import tempfile
import tomllib

# Spin's variable names: lowercase ASCII letters, digits and underscores, a letter first.
NAME = re.compile(r"[a-z][a-z0-9_]*")
# A .env line that sets one of Spin's variables (dotenv's `export` prefix allowed).
DOTENV_LINE = re.compile(r"\s*(?:export\s+)?SPIN_VARIABLE_([A-Za-z0-9_]+)\s*=")


def toml_string(value: str) -> str:
    """A TOML basic string: JSON's escapes are TOML's, but for DEL, which TOML escapes too."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def fail(message: str) -> int:
    print(f"variables.py: {message}", file=sys.stderr)
    return 2


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
        return fail(f"cannot read {args.manifest}: {e}")
    given = {}
    for position, item in enumerate(args.values, start=1):
        name, sep, value = item.partition("=")
        # Never the argument itself in a message: a mistyped one may be a secret.
        if not sep or not NAME.fullmatch(name):
            return fail(f"argument {position} is not NAME=VALUE (NAME: a-z, 0-9, _)")
        if name not in declared:
            return fail(f"argument {position}: '{name}' is not a variable of {args.manifest}")
        given[name] = value

    dotenv = set()
    if os.path.isfile(".env"):
        with open(".env", encoding="utf-8", errors="replace") as f:
            dotenv = {m.group(1).lower() for m in map(DOTENV_LINE.match, f) if m}
    lines, missing = [], []
    for name, spec in declared.items():
        value = given.get(name)
        if value is None:
            value = os.environ.get(f"SPIN_VARIABLE_{name.upper()}")
        if value is None and name in dotenv:
            return fail(
                f".env sets SPIN_VARIABLE_{name.upper()}, which Spin reads only through its "
                "environment provider and this file would replace: export it or give "
                f"{name}=VALUE"
            )
        if value is None and isinstance(spec, dict):
            value = spec.get("default")
        if value is None:
            missing.append(name)
            continue
        lines.append(f"{toml_string(name)} = {toml_string(str(value))}\n")
    try:
        data = "".join(lines).encode("utf-8")
    except UnicodeEncodeError:
        return fail("a value is not valid UTF-8 (no file written)")

    if args.output == "-":
        sys.stdout.buffer.write(data)
    else:
        # A new file beside the target, mode 0600 from its creation, renamed over it: a file
        # or link already there, whoever owns it, never receives the secrets.
        folder = os.path.dirname(os.path.abspath(args.output))
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".variables-", suffix=".toml")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temp, args.output)
        except OSError as e:
            os.unlink(temp)
            return fail(f"cannot write {args.output}: {e.strerror}")
        print(f"variables.py: {len(lines)} variables written to {args.output}", file=sys.stderr)
    if missing:
        print(
            f"variables.py: no value for {', '.join(missing)} (required: give NAME=VALUE)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
