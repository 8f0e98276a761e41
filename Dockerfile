# The Mira image: one `mira` binary, every role a subcommand
# (`mira serve`, `mira catalog`, `mira ingester`, ...), run as a non-root
# user. The Helm chart (deploy/helm/mira) passes the subcommand as args.
#
#   docker build -t registry.example.com/mira:0.1.0 .
#
# scripts/image.sh builds the same image without a daemon or a registry
# (Debian's buildah and debootstrap); docs/operations.md#the-image.

# ---- build ----------------------------------------------------------------
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p mira \
 && install -D -m 0755 target/release/mira /out/usr/local/bin/mira

# ---- run ------------------------------------------------------------------
FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 mira \
 && useradd --system --uid 10001 --gid 10001 --home-dir /data --shell /usr/sbin/nologin mira \
 && install -d -o 10001 -g 10001 /data
COPY --from=build /out/ /
USER 10001:10001
WORKDIR /data
# OTLP gRPC, OTLP HTTP, queries, catalog, compactor, operator.
EXPOSE 4317 4318 3100 7400 7600 8080
ENTRYPOINT ["/usr/local/bin/mira"]
CMD ["serve", "--data-dir", "/data"]
