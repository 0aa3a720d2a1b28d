#!/usr/bin/env bash
# The route users take on their own machines: a fresh venv, torch first, then `pip install .` with
# no extras; then the core commands and the one-line errors of features whose extra is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip install -q torch==2.13.0
"$work/venv/bin/python" -m pip install -q .
du -sh "$work/venv" | sed 's/^/core install with torch: /'
(cd "$work" && "$work/venv/bin/python" "$OLDPWD/.ci/core_check.py")
