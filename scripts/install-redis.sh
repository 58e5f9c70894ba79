#!/usr/bin/env bash
# Installs redis-server from Debian's packages if it is not already on PATH. Idempotent.
# Needed by the Redis tests (scripts/test.sh runs this) and the benchmarks.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1; then
    echo "redis-server already installed: $(redis-server --version)"
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-redis.sh: need root to apt-get install redis-server" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y --no-install-recommends redis-server
echo "installed: $(redis-server --version)"
