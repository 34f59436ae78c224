#!/bin/sh
# Renders a unisum timeline (Chrome trace-event JSON, UNISUM_TRACE_FILE)
# in Chromium's own trace viewer and takes a screenshot of it.
#
#   sh bench/timeline_screenshot.sh TRACE.json OUT.png [FROM_MS TO_MS]
#
# Installs what is missing first: Chromium and Node.js (install-deps.sh
# bench), and puppeteer-core from the npm registry into PPTR_DIR (default
# /tmp/pptr, never into the repository).
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
sh "$HERE/../scripts/install-deps.sh" bench
PPTR_DIR=${PPTR_DIR:-/tmp/pptr}
if [ ! -d "$PPTR_DIR/node_modules/puppeteer-core" ]; then
	mkdir -p "$PPTR_DIR"
	npm install --silent --no-save --prefix "$PPTR_DIR" puppeteer-core >&2
fi
PPTR_DIR=$PPTR_DIR exec node "$HERE/timeline_screenshot.mjs" "$@"
