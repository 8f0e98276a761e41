#!/usr/bin/env bash
# Creates .venv with the Python test dependencies (tests/e2e/requirements.txt);
# does nothing when they are already installed.
set -euo pipefail
cd "$(dirname "$0")/.."
req=tests/e2e/requirements.txt
stamp=.venv/.requirements.sha256
want=$(sha256sum "$req" | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
python3 -m venv .venv
.venv/bin/pip install --quiet --disable-pip-version-check -r "$req"
echo "$want" > "$stamp"
