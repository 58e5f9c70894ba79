#!/usr/bin/env bash
# Every benchmark, crawlq and its peers in one run; rewrites the results in BENCHMARKS.md.
# Usage: bash scripts/bench.sh [--big N] [--skip-peers]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench
bash scripts/install-redis.sh
mkdir -p results
.venv/bin/python -m benchmarks.run --write BENCHMARKS.md --json "results/bench-$(date -u +%Y%m%dT%H%M).json" "$@"
