#!/usr/bin/env bash
# Every check: lint, types, then all tests. Sets up .venv first (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/install-redis.sh >/dev/null  # the Redis tests start a real redis-server
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1; bash scripts/install-chromium.sh >/dev/null  # dashboard, browser tests
.venv/bin/ruff check src tests benchmarks
.venv/bin/ruff format --check src tests benchmarks
.venv/bin/mypy
.venv/bin/pytest "$@"
