#!/usr/bin/env sh
# Make sure Debian's chromium is at /usr/bin/chromium for the browser test (tests/e2e/).
# Idempotent: does nothing when it is already installed.
set -eu

if [ -x /usr/bin/chromium ]; then
    echo "chromium present: $(/usr/bin/chromium --version 2>/dev/null || echo /usr/bin/chromium)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi

echo "installing chromium from Debian (apt-get)..."
$SUDO apt-get update
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends chromium fonts-dejavu-core
/usr/bin/chromium --version
