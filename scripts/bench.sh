#!/usr/bin/env bash
# Every benchmark in one run: crawlq on SQLite, then crawlq on Redis and its peers on one
# redis-server; rewrites the results in BENCHMARKS.md and keeps the records in results/.
# Usage: bash scripts/bench.sh [--big N] [--skip-peers] [--skip-redis]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench
bash scripts/install-redis.sh
mkdir -p results
.venv/bin/python -m benchmarks.run --write BENCHMARKS.md --json "results/bench-$(date -u +%Y%m%dT%H%M).json" "$@"
