#!/bin/sh
# The Azure Functions custom handler: runs the leasegate Spin app on the port the Functions
# host chose. App settings reach the app as Spin variables: an app setting
# SPIN_VARIABLE_STORAGE_KEY is the variable storage_key (Spin reads SPIN_VARIABLE_* itself).
set -eu
cd "$(dirname "$0")"
port="${FUNCTIONS_CUSTOMHANDLER_PORT:?the Azure Functions host sets FUNCTIONS_CUSTOMHANDLER_PORT}"
# The app folder is read-only when run from a package: Spin keeps its state and logs elsewhere.
state="${LEASEGATE_SPIN_STATE_DIR:-${TMPDIR:-/tmp}/leasegate-spin}"
mkdir -p "$state"
export HOME="${HOME:-$state}"
exec ./spin up --from spin.toml --listen "127.0.0.1:$port" --state-dir "$state"
