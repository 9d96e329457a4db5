#!/usr/bin/env bash
# leasegate's entry point on a fresh machine: installs what the project needs, then
#   scripts/dev.sh run     serves the Spin app on 127.0.0.1:3000 with `spin up` (and the timer
#                          functions on the cron trigger) with a local Azurite and a webhook sink
#   scripts/dev.sh test    runs every test (unit, signing vectors, Azurite, the .wasm components
#                          under the real `spin up`)
#   scripts/dev.sh demo    starts a local Azurite and takes and shows a lease with the CLI
#   scripts/dev.sh cli     builds the operator CLI, target/release/leasegate (or install it on
#                          your PATH: cargo install --path shared/leasegate-cli --locked)
#   scripts/dev.sh bench   one table: decisions/s and latency of storage alone, the Azure SDKs for
#                          Python and JavaScript, the app, a hello-world component and the
#                          throttle's limit, at concurrency 1, 4 and 16 (its own Azurite), then
#                          a bearer token against SharedKey over HTTPS; `--only entra` runs that
#                          section alone (no Python SDK)
#   scripts/dev.sh check   the model checker (tests/model): the bounded checks the tests run, with
#                          states explored; `--deep [--minutes N] [--seed S]` explores larger bounds
#                          for N minutes (default 10), then random walks from seed S (printed)
#   scripts/dev.sh soak --minutes N   the app under spin up for N minutes: two deployments on
#                          one Azurite with storage faults and two storage restarts, load,
#                          gate holders and a per-second job; prints what held (not part of CI)
#   scripts/dev.sh ttl-bench   one TTL sweep pass of 100,000 blobs (1 % due) by 4 workers under
#                          spin up, with ttl_find = list and = tags, then with nothing due:
#                          storage requests and time per pass (its own Azurite; --blobs N ...);
#                          --contract: issue 48's 2,101 blobs marked by metadata alone, swept
#                          with the defaults
#   scripts/dev.sh setup   only installs (the pinned toolchain + wasm32-wasip2, the pinned Azurite,
#                          Spin and its cron plugin, faketime)
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }

# The Spin CLI and cron trigger plugin this project is tested with. Spin 4.x runs the
# components (spin-sdk 5.2, WASI 0.2); the plugin 0.5.0 is the one verified here (0.6.x has the
# same interface and is expected to run, unverified).
SPIN_MAJOR=4
CRON_PLUGIN_VERSION=0.5.0
# Where the Spin build for machines without network access to Spin's releases is kept.
SPIN_TOOLS=../shared/tools

install_spin() {
  if spin --version 2>/dev/null | grep -q "^spin $SPIN_MAJOR\." \
     && spin plugins list --installed 2>/dev/null | grep -q "^trigger-cron $CRON_PLUGIN_VERSION"; then
    return
  fi
  if [ -f "$SPIN_TOOLS/install.sh" ]; then
    say "installing Spin and the trigger-cron plugin from $SPIN_TOOLS"
    bash "$SPIN_TOOLS/install.sh" >&2
  else
    cat >&2 <<TXT
Spin $SPIN_MAJOR.x and its trigger-cron plugin $CRON_PLUGIN_VERSION are needed (the tests run every
component under the real \`spin up\`). Install them the usual way, then run this again:
  curl -fsSL https://spinframework.dev/downloads/install.sh | bash && sudo mv spin /usr/local/bin/
  spin plugins update && spin plugins install trigger-cron --version $CRON_PLUGIN_VERSION
TXT
    exit 1
  fi
}

install_faketime() {
  command -v faketime >/dev/null 2>&1 && return
  say "installing faketime (the tests run spin up with its clock ahead or behind)"
  if [ "$(id -u)" = 0 ]; then
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime; } >&2
  else
    echo "faketime is missing: sudo apt-get install faketime (or your system's package)" >&2
    exit 1
  fi
}

setup() {
  local toolchain
  toolchain=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
  # RUSTUP_AUTO_INSTALL=0 on these machines: nothing named in rust-toolchain.toml installs by
  # itself, so install the pinned toolchain, its components and the wasm target explicitly.
  if ! rustup run "$toolchain" rustc --version >/dev/null 2>&1; then
    say "installing Rust $toolchain"
    rustup toolchain install "$toolchain" --profile minimal --component rustfmt,clippy
  fi
  if ! rustup target list --installed --toolchain "$toolchain" | grep -qx wasm32-wasip2; then
    say "adding the wasm32-wasip2 target"
    rustup target add --toolchain "$toolchain" wasm32-wasip2
  fi
  rustup component add --toolchain "$toolchain" rustfmt clippy >/dev/null 2>&1 || true
  if [ ! -x tests/azurite/node_modules/.bin/azurite-blob ] \
     || [ tests/azurite/package-lock.json -nt tests/azurite/node_modules/.package-lock.json ]; then
    say "installing Azurite (pinned in tests/azurite/package-lock.json)"
    npm ci --prefix tests/azurite --no-audit --no-fund --loglevel=error
  fi
  install_spin
  install_faketime
  if ! python3 -c 'import yaml' 2>/dev/null; then
    say "installing PyYAML (tests/tests/deploy/ parses the SpinKube manifests with it)"
    python3 -m pip install --quiet --disable-pip-version-check pyyaml
  fi
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Starts Azurite on 127.0.0.1:10000 with its data in .leasegate/azurite, unless one already runs.
start_azurite() {
  if port_open 10000; then
    say "something already listens on 127.0.0.1:10000; using it as Azurite"
    return
  fi
  mkdir -p .leasegate/azurite
  say "starting Azurite on 127.0.0.1:10000 (data in .leasegate/azurite, log in .leasegate/azurite.log)"
  # Azurite's stdin is a pipe held by this script: when the script ends, however it ends, the
  # pipe closes and tests/azurite/run.js stops Azurite.
  exec 9> >(exec node tests/azurite/run.js --blobHost 127.0.0.1 --blobPort 10000 \
    --location .leasegate/azurite --skipApiVersionCheck --loose --disableTelemetry \
    > .leasegate/azurite.log 2>&1)
  AZURITE_PID=$!
  for _ in $(seq 1 100); do
    port_open 10000 && return
    sleep 0.2
  done
  echo "Azurite did not start; see .leasegate/azurite.log" >&2
  exit 1
}

build_cli() {
  say "building the CLI (target/release/leasegate)"
  cargo build --locked --release -p leasegate-cli
}

demo() {
  setup
  build_cli
  start_azurite
  export LEASEGATE_CONNECTION_STRING="${LEASEGATE_CONNECTION_STRING:-UseDevelopmentStorage=true}"
  say "taking and showing a lease (target/release/leasegate demo)"
  target/release/leasegate demo
  cat >&2 <<'TXT'

Try it yourself while Azurite runs (another terminal: scripts/dev.sh azurite):
  target/release/leasegate acquire jobs/nightly --window 30 --holder node-a
  target/release/leasegate acquire jobs/nightly --window 30 --holder node-b   # busy
  target/release/leasegate acquire jobs/weekly --window 600 --holder node-a   # ETag lease record
  target/release/leasegate show jobs/nightly
TXT
}

# Prints scripts/run-examples.txt with its {{placeholders}} filled from NAME=VALUE arguments
# (its header lines, those starting with '#' before the text, left out).
print_examples() {
  python3 - "$@" <<'PY'
import re, sys
values = dict(arg.split("=", 1) for arg in sys.argv[1:])
lines = open("scripts/run-examples.txt").read().splitlines(keepends=True)
while lines and lines[0].startswith("#"):
    lines.pop(0)
sys.stdout.write(re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], "".join(lines)))
PY
}

# An account SAS (read, write, delete, list, add, create; a week) for Azurite's development
# account, whose key is public (spin.toml's default storage_key): the examples write a blob
# with it, as an application would.
dev_sas() {
  python3 - <<'PY'
import base64, datetime, hashlib, hmac, urllib.parse
key = base64.b64decode("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==")
expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=7)
se, sp, sv = expiry.strftime("%Y-%m-%dT%H:%M:%SZ"), "rwdlac", "2021-12-02"
# Account SAS, version 2020-12-06 on: account, sp, ss, srt, st, se, sip, spr, sv, ses, each
# followed by a newline.
to_sign = "\n".join(["devstoreaccount1", sp, "b", "sco", "", se, "", "", sv, ""]) + "\n"
sig = base64.b64encode(hmac.new(key, to_sign.encode(), hashlib.sha256).digest()).decode()
q = urllib.parse.quote
print(f"sv={sv}&ss=b&srt=sco&sp={sp}&se={q(se, safe='')}&sig={q(sig, safe='')}")
PY
}

COMPONENTS=(device-alerts gate scheduled-job leader init-once ttl-sweeper)

build_components() {
  say "building the components (wasm32-wasip2, release)"
  cargo build --locked --release --target wasm32-wasip2 "${COMPONENTS[@]/#/--package=}"
  for c in "${COMPONENTS[@]}"; do ls -l "target/wasm32-wasip2/release/${c//-/_}.wasm" >&2; done
}

run() {
  setup
  if port_open 3000; then
    echo "127.0.0.1:3000 is taken; stop whatever listens there first" >&2
    exit 1
  fi
  build_components
  # Whatever this script started in the background stops with it, however it ends.
  trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
  trap 'exit 130' INT TERM
  start_azurite
  if ! port_open 3001; then
    say "starting the webhook sink on 127.0.0.1:3001 (notifications are printed below)"
    python3 scripts/webhook_sink.py 3001 &
  fi
  local token="${LEASEGATE_GATE_TOKEN:-dev-$(python3 -c 'import secrets; print(secrets.token_hex(12))')}"
  local telemetry="${LEASEGATE_TELEMETRY_TOKEN:-dev-$(python3 -c 'import secrets; print(secrets.token_hex(12))')}"
  local timer="${LEASEGATE_TIMER_TOKEN:-dev-$(python3 -c 'import secrets; print(secrets.token_hex(12))')}"
  local admin="${LEASEGATE_ADMIN_TOKEN:-dev-$(python3 -c 'import secrets; print(secrets.token_hex(12))')}"
  # The key of derived lease ids (the leader's): one secret shared by every deployment.
  local lease_secret="${LEASEGATE_LEASE_ID_SECRET:-dev-$(python3 -c 'import secrets; print(secrets.token_hex(16))')}"
  local ttl_containers="${LEASEGATE_TTL_CONTAINERS:-scratch}"
  local vars=(--variable gate_token="$token" --variable telemetry_token="$telemetry"
              --variable timer_token="$timer" --variable admin_token="$admin"
              --variable lease_id_secret="$lease_secret"
              --variable instance_id="${LEASEGATE_INSTANCE_ID:-dev-local}"
              --variable ttl_containers="$ttl_containers"
              --variable ttl_lock_retention_seconds=86400)
  # The examples' blob: in the first swept container, under its prefix. The container is made
  # here (through a SAS of Azurite's well-known development account), as the sweeper expects.
  local first="${ttl_containers%%,*}"
  first="${first// /}"
  local swept="${first%%/*}" prefix=""
  [[ "$first" == */* ]] && prefix="${first#*/}"
  local storage=http://127.0.0.1:10000/devstoreaccount1 sas
  sas=$(dev_sas)
  curl -s -o /dev/null -X PUT "$storage/$swept?restype=container&$sas" || true
  print_examples app=http://127.0.0.1:3000 telemetry_token="$telemetry" gate_token="$token" \
    timer_token="$timer" admin_token="$admin" storage="$storage" sas="$sas" \
    container="$swept" blob="${prefix}some/blob" >&2
  say "running the timer functions with spin up -f spin-cron.toml (the trigger-cron plugin)"
  spin up -f spin-cron.toml --state-dir .spin/timers "${vars[@]}" &
  say "serving with spin up (Ctrl-C to stop)"
  spin up --listen 127.0.0.1:3000 "${vars[@]}" &
  # Waiting (rather than running in the foreground) lets a signal reach the traps at once.
  wait "$!"
}

# The Azure SDK for Python that the benchmark compares with, in a virtualenv under target/.
BENCH_VENV=target/bench-venv
BENCH_SDK="azure-storage-blob==12.31.1 azure-core==1.41.0"

# The Azure SDK for JavaScript, pinned in tests/bench-js/package-lock.json, installed beside its
# script (nothing is fetched while the bench runs).
BENCH_JS=tests/bench-js

bench() {
  setup
  build_components
  case " $* " in
    *" --only "*) # one section (entra, components, floor): no SDK
      cargo build --locked --release --target wasm32-wasip2 -p bench-hello
      cargo build --locked -p leasegate-tests --bin leasegate-bench
      target/debug/leasegate-bench "$@"
      return
      ;;
  esac
  local installed
  installed=$("$BENCH_VENV/bin/python" -c 'import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("azure-storage-blob", "azure-core")))' 2>/dev/null || true)
  if [ "$installed" != "$BENCH_SDK" ]; then
    say "installing $BENCH_SDK into $BENCH_VENV"
    python3 -m venv "$BENCH_VENV"
    # shellcheck disable=SC2086  # one word per requirement
    "$BENCH_VENV/bin/pip" install --disable-pip-version-check --quiet $BENCH_SDK
  fi
  if [ ! -d "$BENCH_JS/node_modules/@azure/storage-blob" ] \
     || [ "$BENCH_JS/package-lock.json" -nt "$BENCH_JS/node_modules/.package-lock.json" ]; then
    say "installing the Azure SDK for JavaScript (pinned in $BENCH_JS/package-lock.json)"
    npm ci --prefix "$BENCH_JS" --no-audit --no-fund --loglevel=error
  fi
  say "building the hello-world reference (tests/bench-hello) and the load generator"
  cargo build --locked --release --target wasm32-wasip2 -p bench-hello
  cargo build --locked -p leasegate-tests --bin leasegate-bench
  say "benchmarking: storage alone, the SDKs, the app, the references (about 3 minutes; progress below)"
  target/debug/leasegate-bench --python "$BENCH_VENV/bin/python" --node "$(command -v node)" "$@"
}

ttl_bench() {
  setup
  build_components
  say "building the TTL sweep benchmark (tests/src/bin/leasegate-ttl-bench)"
  cargo build --locked -p leasegate-tests --bin leasegate-ttl-bench
  say "benchmarking TTL sweep passes (creating the blobs takes minutes; progress below)"
  target/debug/leasegate-ttl-bench "$@"
}

soak() {
  setup
  build_components
  say "building the soak (tests/src/bin/leasegate-soak)"
  cargo build --locked -p leasegate-tests --bin leasegate-soak
  say "soaking: progress every minute below, the summary at the end"
  target/debug/leasegate-soak "$@"
}

usage() {
  cat <<'USAGE'
usage: scripts/dev.sh COMMAND [ARGS...]

  setup      install what is missing: the Rust toolchain and wasm32-wasip2, the pinned Azurite,
             Spin and its trigger-cron plugin, faketime, PyYAML
  run        build the components, start Azurite and a webhook sink, serve the app on 127.0.0.1:3000
  test       every test: unit, signing vectors, the model checker, Azurite, the .wasm under spin up
  check      the model checker (tests/model); `check --deep` for the larger bounds
  bench      round trips and decisions per second under spin up (docs/benchmarks.md)
  ttl-bench  the sweeper on a large container
  soak       a long run with faults, progress every minute
  demo       take and show a lease with the CLI against a local Azurite
  cli        build target/release/leasegate
  azurite    start Azurite alone until Ctrl-C

  -h, --help  this text
USAGE
}

case "${1:-}" in
  -h | --help | help) usage ;;
  setup) setup ;;
  run) run ;;
  demo) demo ;;
  cli)
    build_cli
    say "built target/release/leasegate (try: target/release/leasegate --help)"
    ;;
  azurite)
    setup
    start_azurite
    say "Azurite runs until you press Ctrl-C"
    while kill -0 "${AZURITE_PID:-0}" 2>/dev/null || port_open 10000; do sleep 1; done
    ;;
  bench) shift; bench "$@" ;;
  check)
    shift
    setup
    say "building the model checker (tests/model)"
    # The dev profile: the model crate and what it drives are optimized there (Cargo.toml).
    cargo build --locked -p leasegate-model --bin leasegate-check
    target/debug/leasegate-check "$@"
    ;;
  soak) shift; soak "$@" ;;
  ttl-bench) shift; ttl_bench "$@" ;;
  test)
    setup
    say "running the tests"
    # --no-fail-fast: one failing test binary does not hide what the others would say.
    cargo test --workspace --locked --no-fail-fast
    ;;
  *)
    if [ -n "${1:-}" ]; then echo "scripts/dev.sh: unknown command '$1'" >&2; fi
    usage >&2
    exit 2
    ;;
esac
