#!/usr/bin/env bash
# Builds the Mira image without a container daemon or a registry, from
# Debian's packages, and smoke-tests it. Needs root (buildah's vfs storage,
# debootstrap, chroot). Not part of CI: it needs a release build (~16 min on
# 2 cores).
#
#   scripts/image.sh                 # -> oci-archive target/mira-image.tar, image localhost/mira:<version>
#
# Steps (the Dockerfile's, done by hand):
#   1. cargo build --release -p mira (CARGO_TARGET_DIR honoured; set
#      MIRA_BUILD_LOCK=/path to run cargo under flock on a shared machine);
#   2. a minimal Debian root filesystem (debootstrap --variant=minbase, the
#      release Debian's slim images are made from) plus ca-certificates and
#      a `mira` user (uid/gid 10001), the binary at /usr/local/bin/mira;
#   3. buildah (storage driver vfs: no overlay or fuse needed) from scratch,
#      the root filesystem copied in, entrypoint `mira`, user 10001, commit,
#      and an OCI archive written;
#   4. smoke test inside the image's own root filesystem (buildah mount +
#      chroot: this machine cannot run an OCI runtime): `mira --version`,
#      then `mira serve` as uid 10001 answering /ready, then `mira smoke`.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
IMAGE=${IMAGE:-localhost/mira:$VERSION}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
OUT=${OUT:-$TARGET/mira-image.tar}
SUITE=${SUITE:-bookworm}
STORE=(--storage-driver vfs)
WORK=$(mktemp -d /tmp/mira-image.XXXXXX)
ctr=""
serve_pid=""
cleanup() {
  [ -n "$serve_pid" ] && kill "$serve_pid" 2>/dev/null && wait "$serve_pid" 2>/dev/null
  [ -n "$ctr" ] && { buildah "${STORE[@]}" umount "$ctr" >/dev/null 2>&1 || true; buildah "${STORE[@]}" rm "$ctr" >/dev/null 2>&1 || true; }
  rm -rf "$WORK"
}
trap cleanup EXIT
step() { echo "== $(date +%H:%M:%S) $*"; }

if [ "$(id -u)" != 0 ]; then echo "scripts/image.sh: run as root (buildah vfs storage, debootstrap, chroot)" >&2; exit 2; fi
need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  step "apt-get install ${need[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

step "cargo build --release -p mira (target $TARGET)"
build=(cargo build --release --locked -p mira)
if [ -n "${MIRA_BUILD_LOCK:-}" ]; then build=(flock "$MIRA_BUILD_LOCK" "${build[@]}"); fi
CARGO_TARGET_DIR=$TARGET "${build[@]}"
BIN=$TARGET/release/mira

step "debootstrap --variant=minbase $SUITE"
RFS=$WORK/rootfs
debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$RFS" >"$WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$WORK/debootstrap.log" >&2; echo "debootstrap failed" >&2; exit 1; }
chroot "$RFS" groupadd --system --gid 10001 mira
chroot "$RFS" useradd --system --uid 10001 --gid 10001 --home-dir /data --shell /usr/sbin/nologin mira
install -d -o 10001 -g 10001 "$RFS/data"
install -D -m 0755 "$BIN" "$RFS/usr/local/bin/mira"
# What a slim image leaves out: apt lists, caches, docs, man pages.
rm -rf "$RFS"/var/lib/apt/lists/* "$RFS"/var/cache/apt/*.bin "$RFS"/usr/share/doc/* "$RFS"/usr/share/man/* \
  "$RFS"/usr/share/locale/* "$RFS"/var/log/*.log

step "buildah from scratch (vfs), commit $IMAGE"
ctr=$(buildah "${STORE[@]}" from scratch)
mnt=$(buildah "${STORE[@]}" mount "$ctr")
cp -a "$RFS"/. "$mnt"/
buildah "${STORE[@]}" config --entrypoint '["/usr/local/bin/mira"]' --cmd 'serve --data-dir /data' \
  --user 10001:10001 --workingdir /data \
  --port 4317 --port 4318 --port 3100 --port 7400 --port 7600 --port 8080 \
  --label org.opencontainers.image.title=mira --label "org.opencontainers.image.version=$VERSION" "$ctr"

step "smoke test inside the image's root filesystem"
chroot "$mnt" /usr/local/bin/mira --version
data=/data/smoke
install -d -o 10001 -g 10001 "$mnt$data"
chroot --userspec=10001:10001 "$mnt" /usr/local/bin/mira serve --data-dir "$data" --listen 127.0.0.1:13100 \
  --grpc-listen 127.0.0.1:14317 --http-listen 127.0.0.1:14318 --catalog-listen 127.0.0.1:17400 \
  >"$WORK/serve.log" 2>&1 &
serve_pid=$!
for _ in $(seq 1 300); do
  if curl -sf http://127.0.0.1:13100/ready >/dev/null; then break; fi
  if ! kill -0 "$serve_pid" 2>/dev/null; then cat "$WORK/serve.log" >&2; echo "mira serve exited" >&2; exit 1; fi
  sleep 0.2
done
echo "GET /ready: $(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:13100/ready)"
curl -sf http://127.0.0.1:13100/ready >/dev/null || { cat "$WORK/serve.log" >&2; echo "/ready never answered 200" >&2; exit 1; }
chroot --userspec=10001:10001 "$mnt" /usr/local/bin/mira smoke --otlp http://127.0.0.1:14318 \
  --query http://127.0.0.1:13100 --tenant image-smoke --timeout 60s
kill -TERM "$serve_pid"; wait "$serve_pid" || true; serve_pid=""
rm -rf "${mnt:?}$data"
buildah "${STORE[@]}" umount "$ctr" >/dev/null

buildah "${STORE[@]}" commit --quiet "$ctr" "$IMAGE" >/dev/null
rm -f "$OUT"
buildah "${STORE[@]}" push --quiet "$IMAGE" "oci-archive:$OUT:$IMAGE"
step "done"
buildah "${STORE[@]}" images --format '{{.Name}}:{{.Tag}} {{.ID}} {{.Size}}' "$IMAGE"
ls -la "$OUT"
echo "load it elsewhere with: podman load -i $OUT   (or skopeo copy oci-archive:$OUT docker://REGISTRY/mira:$VERSION)"
