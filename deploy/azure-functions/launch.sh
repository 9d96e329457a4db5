#!/bin/sh
# The Azure Functions custom handler (host.json's defaultExecutablePath): runs the leasegate Spin
# app on the port the Functions host chose, FUNCTIONS_CUSTOMHANDLER_PORT (set only in this
# process's environment).
#
# Why a launcher: `func azure functionapp publish --custom` zips the app giving the execute bit
# to defaultExecutablePath alone (this file), so the `spin` beside it arrives without one, and
# on plans that run from the package the folder is read-only. So `spin` is copied to a
# writable folder and marked executable there, then started.
#
# App settings reach the app as Spin variables: an app setting SPIN_VARIABLE_STORAGE_KEY is the
# variable storage_key (Spin reads SPIN_VARIABLE_* itself). This script adds:
#   * instance_id: every instance of a scaled-out app gets its own identity. The app setting
#     SPIN_VARIABLE_INSTANCE_ID names the deployment (default "azure"); on Azure the first 12
#     characters of WEBSITE_INSTANCE_ID (one per instance) are appended: "westeurope.1a2b3c4d5e6f".
#   * the managed identity's token endpoint, when the platform gives one (IDENTITY_ENDPOINT,
#     IDENTITY_HEADER): SPIN_VARIABLE_IDENTITY_ENDPOINT and SPIN_VARIABLE_IDENTITY_HEADER (the
#     platform rotates the header: it is read at each start), and, with the app setting
#     SPIN_VARIABLE_STORAGE_AUTH=managed_identity, SPIN_VARIABLE_TOKEN_ORIGIN (the endpoint's
#     scheme://host[:port], which the components may reach: allowed_outbound_hosts).
set -eu
here="$(cd "$(dirname "$0")" && pwd)"
port="${FUNCTIONS_CUSTOMHANDLER_PORT:?the Azure Functions host sets FUNCTIONS_CUSTOMHANDLER_PORT}"

# Spin's state (the key-value store) and logs, and the executable copy of spin, live outside
# the app folder.
state="${LEASEGATE_SPIN_STATE_DIR:-${TMPDIR:-/tmp}/leasegate-spin}"
mkdir -p "$state/bin"
export HOME="${HOME:-$state}"
if [ ! -f "$here/spin" ]; then
  echo "launch.sh: $here/spin is missing: assemble the app with deploy/azure-functions/assemble.py --spin PATH" >&2
  exit 1
fi
# Copied beside, then renamed into place: another worker process may be running the previous
# copy (overwriting a running executable fails with "Text file busy"; a rename does not).
cp "$here/spin" "$state/bin/spin.$$"
chmod 755 "$state/bin/spin.$$"
mv -f "$state/bin/spin.$$" "$state/bin/spin"

deployment="${SPIN_VARIABLE_INSTANCE_ID:-azure}"
if [ -n "${WEBSITE_INSTANCE_ID:-}" ]; then
  instance="$(printf '%s' "$WEBSITE_INSTANCE_ID" | tr -cd 'A-Za-z0-9' | cut -c1-12)"
  # instance_id allows 64 characters: the deployment's name keeps at most 51 of them.
  deployment="$(printf '%s' "$deployment" | cut -c1-51).$instance"
fi
export SPIN_VARIABLE_INSTANCE_ID="$deployment"

if [ -n "${IDENTITY_ENDPOINT:-}" ]; then
  export SPIN_VARIABLE_IDENTITY_ENDPOINT="$IDENTITY_ENDPOINT"
  export SPIN_VARIABLE_IDENTITY_HEADER="${IDENTITY_HEADER:-}"
  # scheme://host[:port] of the endpoint: everything before the first "/" after "://".
  scheme="${IDENTITY_ENDPOINT%%://*}"
  rest="${IDENTITY_ENDPOINT#*://}"
  if [ "${SPIN_VARIABLE_STORAGE_AUTH:-}" = managed_identity ]; then
    export SPIN_VARIABLE_TOKEN_ORIGIN="$scheme://${rest%%/*}"
  fi
fi

cd "$here"
exec "$state/bin/spin" up --from spin.toml --listen "127.0.0.1:$port" \
  --state-dir "$state/state" --log-dir "$state/logs"
