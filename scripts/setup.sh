#!/usr/bin/env bash
# Creates .venv with crawlq and its development tools. Idempotent; safe to re-run.
# Usage: bash scripts/setup.sh [extra ...]   e.g. bash scripts/setup.sh bench
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
extras="dev${1:+,$1}"
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e ".[${extras}]"
