#!/usr/bin/env bash
# Creates .venv with the Python test dependencies (tests/e2e/requirements.txt
# and tests/chart/requirements.txt); does nothing when they are already
# installed. A half-made .venv (an interrupted run: no python, no pip, or a
# failed install, so no stamp) is removed and made again.
set -euo pipefail
cd "$(dirname "$0")/.."
reqs=(tests/e2e/requirements.txt tests/chart/requirements.txt)
stamp=.venv/.requirements.sha256
want=$(cat "${reqs[@]}" | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
if [ -e .venv ] && ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  rm -rf .venv
fi
python3 -m venv .venv
rm -f "$stamp"
for r in "${reqs[@]}"; do
  .venv/bin/pip install --quiet --disable-pip-version-check -r "$r"
done
echo "$want" > "$stamp"
