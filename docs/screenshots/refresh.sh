#!/usr/bin/env bash
# Refresh the README's screenshots of the fleet page: runs the real page test (Airflow
# api-server + headless Debian chromium on the seeded 200-node store) and copies its
# fleet views here. Needs: apt-get install -y chromium; pip install playwright.
set -euo pipefail
cd "$(dirname "$0")/../.."
GPU_POOL_SCREENSHOT_DIR="$PWD/docs/screenshots" .venv/bin/python -m pytest -q tests/ui/test_page.py
ls -l docs/screenshots/*.png
