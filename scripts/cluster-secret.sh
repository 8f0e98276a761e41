#!/usr/bin/env bash
# Writes a fresh cluster secret (64 hex characters) to DIR/cluster-secret
# and prints its path, for scripts that start `mira catalog` or `mira
# ingester` (their internal ports refuse calls without it; see
# docs/security.md):  export MIRA_CLUSTER_SECRET_FILE=$(scripts/cluster-secret.sh "$work")
set -euo pipefail
dir=${1:?usage: cluster-secret.sh DIR}
f="$dir/cluster-secret"
(umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$f")
echo "$f"
