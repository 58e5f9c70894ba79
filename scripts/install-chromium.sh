#!/usr/bin/env bash
# Installs Debian's chromium if /usr/bin/chromium is missing. Idempotent.
# The dashboard and browser-rendering tests drive it with Playwright, which must never download
# a browser of its own.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    echo "chromium already installed: $(/usr/bin/chromium --version 2>/dev/null || echo unknown)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-chromium.sh: need root to apt-get install chromium" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends chromium
echo "installed: $(/usr/bin/chromium --version 2>/dev/null || echo chromium)"
