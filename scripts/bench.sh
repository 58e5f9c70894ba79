#!/usr/bin/env bash
# Every benchmark in one run: crawlq on SQLite, then crawlq on Redis and its peers on one
# redis-server, then the crawler against Scrapy on the synthetic web; rewrites the results in
# BENCHMARKS.md and keeps the records in results/.
# Usage: bash scripts/bench.sh [--big N] [--skip-peers] [--skip-redis]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh bench
bash scripts/install-redis.sh
mkdir -p results
stamp=$(date -u +%Y%m%dT%H%M)
.venv/bin/python -m benchmarks.run --write BENCHMARKS.md --json "results/bench-$stamp.json" "$@"
.venv/bin/python -m benchmarks.crawl_bench --write BENCHMARKS.md --json "results/crawl-$stamp.json"
