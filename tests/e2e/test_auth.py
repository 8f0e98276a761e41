"""Authentication and TLS with real clients (docs/security.md): `mira serve
--auth tokens` over TLS, written to by the OpenTelemetry Python SDK's gRPC
and HTTP exporters with bearer tokens and by a real OpenTelemetry Collector
(`otelcol-contrib`) with a bearer token in its exporter headers, read with
HTTP basic auth as Grafana's data sources send it; wrong, expired, revoked
(removed from the tokens file, refused after the reload) and missing
credentials on the OTLP gRPC, OTLP HTTP and query ports; a certificate
rotated while clients stay connected; client certificates; the
trusted-header mode."""

import base64
import hashlib
import http.client
import logging
import os
import socket
import ssl
import sys
import urllib.error
import urllib.request

import grpc
from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter as GrpcLogExporter
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter as HttpLogExporter
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

sys.path.insert(0, os.path.dirname(__file__))
from certs import Ca, write_atomic  # noqa: E402
from serve_proc import Serve, wait_until  # noqa: E402
from test_collectors import OTELCOL, run, stop  # noqa: E402

TOKENS = {
    "writer-acme": ("w-acme-6f1c0d2e9b", ["acme"], ["write"], None),
    "writer-beta": ("w-beta-77aa01c3d4", ["beta"], ["write"], None),
    "grafana": ("g-both-0b9e5a4411", ["acme", "beta"], ["read"], None),
    "reader-acme": ("r-acme-3c3c3c3c3c", ["acme"], ["read"], None),
    "expired": ("x-old-9999999999", ["acme"], ["read", "write"], "2020-01-01T00:00:00Z"),
}


def token(name):
    return TOKENS[name][0]


def write_tokens(path, names):
    lines = []
    for n in names:
        tok, tenants, scopes, expires = TOKENS[n]
        lines += ["[[token]]", f'name = "{n}"', f'sha256 = "{hashlib.sha256(tok.encode()).hexdigest()}"',
                  f"tenants = {tenants!r}".replace("'", '"'), f"scopes = {scopes!r}".replace("'", '"')]
        if expires:
            lines.append(f'expires = "{expires}"')
        lines.append("")
    write_atomic(path, "\n".join(lines).encode())


def bearer(name):
    return {"authorization": f"Bearer {token(name)}"}


def basic(name, user="grafana"):
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{token(name)}".encode()).decode()}


def otlp_http(serve, headers, body=b""):
    """(status, body) of an empty OTLP/HTTP logs export over TLS."""
    req = urllib.request.Request(f"https://{serve.http}/v1/logs", data=body, method="POST",
                                 headers={"Content-Type": "application/x-protobuf", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30, context=serve.context) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def otlp_grpc(serve, ca_pem, metadata):
    """The gRPC status code of an empty OTLP logs export over TLS."""
    with grpc.secure_channel(serve.grpc, grpc.ssl_channel_credentials(root_certificates=ca_pem),
                             options=[("grpc.ssl_target_name_override", "localhost")]) as ch:
        try:
            logs_service_pb2_grpc.LogsServiceStub(ch).Export(
                logs_service_pb2.ExportLogsServiceRequest(), metadata=list(metadata.items()), timeout=30)
            return grpc.StatusCode.OK
        except grpc.RpcError as e:
            return e.code()


def send_logs(exporter, bodies, name):
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exporter))
    logger = logging.getLogger(name)
    logger.propagate = False
    handler = LoggingHandler(logger_provider=provider)
    logger.addHandler(handler)
    for b in bodies:
        logger.warning(b)
    provider.shutdown()
    logger.removeHandler(handler)


def lines(serve, headers, **params):
    status, body = serve.api("logs", headers=headers, limit=1000, **params)
    assert status == 200, body
    return {line["record"]["body"].get("stringValue") for line in body["lines"]}


def setup_tls(tmp_path):
    ca = Ca()
    ca_path = ca.write(str(tmp_path / "ca.crt"))
    cert, key, der = ca.write_leaf(str(tmp_path), "server", "mira")
    return ca, ca_path, cert, key, der


def test_tokens_over_tls_with_sdk_exporters_a_collector_and_grafana_basic_auth(tmp_path):
    ca, ca_path, cert, key, _ = setup_tls(tmp_path)
    tokens = str(tmp_path / "tokens.toml")
    write_tokens(tokens, TOKENS)
    serve = Serve("--auth", "tokens", "--auth-tokens-file", tokens, "--reload-interval", "100ms",
                  "--tls-cert", cert, "--tls-key", key, "--seal-age", "1s", ca=ca_path)
    try:
        # The SDK's exporters: gRPC for acme without X-Scope-OrgID (a token
        # of one tenant), HTTP for beta.
        acme_sent = [f"sdk grpc acme {i}" for i in range(20)]
        beta_sent = [f"sdk http beta {i}" for i in range(20)]
        send_logs(GrpcLogExporter(endpoint=f"https://{serve.grpc}", credentials=grpc.ssl_channel_credentials(
            root_certificates=ca.pem()), headers=bearer("writer-acme")), acme_sent, "auth.grpc")
        send_logs(HttpLogExporter(endpoint=f"https://{serve.http}/v1/logs", certificate_file=ca_path,
                                  headers={**bearer("writer-beta"), "X-Scope-OrgID": "beta"}), beta_sent, "auth.http")

        # Grafana: basic auth with the token as password, the tenant header.
        as_acme = {**basic("grafana"), "X-Scope-OrgID": "acme"}
        as_beta = {**basic("grafana"), "X-Scope-OrgID": "beta"}
        wait_until("acme's lines", lambda: set(acme_sent) <= lines(serve, as_acme))
        assert lines(serve, as_acme).isdisjoint(beta_sent)
        wait_until("beta's lines", lambda: set(beta_sent) <= lines(serve, as_beta))
        assert lines(serve, as_beta).isdisjoint(acme_sent)

        # A real Collector with the bearer token in its exporter headers.
        app_log = tmp_path / "app.log"
        collected = [f"collector line {i}" for i in range(50)]
        app_log.write_text("\n".join(collected) + "\n")
        config = tmp_path / "otelcol.yaml"
        config.write_text(f"""
receivers:
  filelog:
    include: [{app_log}]
    start_at: beginning
exporters:
  otlphttp:
    endpoint: https://{serve.http}
    tls:
      ca_file: {ca_path}
    headers:
      authorization: "Bearer {token('writer-acme')}"
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    logs:
      receivers: [filelog]
      exporters: [otlphttp]
""")
        col = run([OTELCOL, "--config", str(config)], tmp_path / "otelcol.log")
        try:
            wait_until("the collector's lines", lambda: set(collected) <= lines(serve, as_acme), timeout=90)
        finally:
            stop(col)
        assert lines(serve, as_beta).isdisjoint(collected)

        # Refusals on OTLP/HTTP: 401 without a valid credential, 403 outside it.
        for headers, want in [
            ({}, 401),
            ({"authorization": "Bearer not-a-token"}, 401),
            (bearer("expired"), 401),
            ({"authorization": "Token abc"}, 401),
            ({"authorization": "Basic !!!"}, 401),
            (bearer("reader-acme"), 403),
            ({**bearer("writer-acme"), "X-Scope-OrgID": "beta"}, 403),
            ({**bearer("writer-acme"), "X-Scope-OrgID": "../acme"}, 400),
            (bearer("writer-acme"), 200),
        ]:
            status, body = otlp_http(serve, headers)
            assert status == want, (headers, status, body)
        # … and on OTLP/gRPC.
        for md, want in [
            ({}, grpc.StatusCode.UNAUTHENTICATED),
            ({"authorization": "Bearer not-a-token"}, grpc.StatusCode.UNAUTHENTICATED),
            (bearer("expired"), grpc.StatusCode.UNAUTHENTICATED),
            (bearer("grafana"), grpc.StatusCode.PERMISSION_DENIED),
            ({**bearer("writer-acme"), "x-scope-orgid": "beta"}, grpc.StatusCode.PERMISSION_DENIED),
            (bearer("writer-acme"), grpc.StatusCode.OK),
        ]:
            assert otlp_grpc(serve, ca.pem(), md) == want, md

        # The query port: 401 with a challenge, 403 with the same words
        # whether the tenant exists (beta) or not (nobody).
        status, body = serve.api("logs")
        assert status == 401, body
        try:
            urllib.request.urlopen(urllib.request.Request(f"https://{serve.query}/loki/api/v1/labels"),
                                   timeout=30, context=serve.context)
            raise AssertionError("no credential was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 401 and "Basic" in e.headers.get("WWW-Authenticate", "")
        assert serve.api("logs", headers=basic("expired"))[0] == 401
        assert serve.api("logs", headers={**basic("writer-acme")})[0] == 403
        refusals = [serve.api("logs", headers={**basic("reader-acme"), "X-Scope-OrgID": t}) for t in ("beta", "nobody")]
        assert refusals[0] == refusals[1] and refusals[0][0] == 403, refusals
        for path in ["/loki/api/v1/query_range", "/api/v1/labels", "/api/search", "/api/mira/v1/labels",
                     "/prometheus/api/v1/rules", "/api/echo"]:
            assert serve.get(path, headers=basic("writer-beta"))[0] == 403, path
            assert serve.get(path)[0] == 401, path
        # The probes stay open (kubelet, Prometheus).
        assert serve.get("/ready")[0] == 200

        # Revocation: writer-acme is removed from the file; after the
        # reload it is refused, the others still work.
        write_tokens(tokens, [n for n in TOKENS if n != "writer-acme"])
        wait_until("the revoked token refused", lambda: otlp_http(serve, bearer("writer-acme"))[0] == 401)
        assert otlp_grpc(serve, ca.pem(), bearer("writer-acme")) == grpc.StatusCode.UNAUTHENTICATED
        assert otlp_http(serve, {**bearer("writer-beta"), "X-Scope-OrgID": "beta"})[0] == 200
        # A broken file keeps the last good tokens.
        write_atomic(tokens, b"[[token]]\nthis is not toml")
        wait_until("the failed reload counted",
                   lambda: 'mira_auth_reloads_total{outcome="error"}' in serve.get("/metrics")[1])
        assert otlp_http(serve, {**bearer("writer-beta"), "X-Scope-OrgID": "beta"})[0] == 200
        assert 'mira_auth_requests_total{scope="write",outcome="unauthenticated"}' in serve.get("/metrics")[1]
    finally:
        serve.kill()


def peer_der(host_port, ca_path):
    host, port = host_port.rsplit(":", 1)
    ctx = ssl.create_default_context(cafile=ca_path)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        with ctx.wrap_socket(s, server_hostname="localhost") as t:
            return t.getpeercert(binary_form=True)


def test_a_certificate_rotated_while_clients_stay_connected(tmp_path):
    ca, ca_path, cert, key, first = setup_tls(tmp_path)
    serve = Serve("--tls-cert", cert, "--tls-key", key, "--reload-interval", "100ms", ca=ca_path)
    try:
        # Clients connected before the rotation: a keep-alive HTTPS
        # connection to the query port and a gRPC channel to OTLP.
        kept = http.client.HTTPSConnection(serve.query, context=serve.context, timeout=30)
        kept.request("GET", "/ready")
        assert kept.getresponse().read() == b"ready\n"
        assert kept.sock.getpeercert(binary_form=True) == first
        channel = grpc.secure_channel(serve.grpc, grpc.ssl_channel_credentials(root_certificates=ca.pem()),
                                      options=[("grpc.ssl_target_name_override", "localhost")])
        stub = logs_service_pb2_grpc.LogsServiceStub(channel)
        stub.Export(logs_service_pb2.ExportLogsServiceRequest(), timeout=30)
        assert peer_der(serve.grpc, ca_path) == first

        _, _, second = ca.write_leaf(str(tmp_path), "server", "mira rotated")
        for addr in (serve.query, serve.grpc, serve.http):
            wait_until(f"{addr} serving the rotated certificate", lambda a=addr: peer_der(a, ca_path) == second)
        # The connections made before still answer, on their old sessions.
        kept.request("GET", "/ready")
        assert kept.getresponse().read() == b"ready\n"
        assert kept.sock.getpeercert(binary_form=True) == first
        kept.close()
        stub.Export(logs_service_pb2.ExportLogsServiceRequest(), timeout=30)
        channel.close()
        # New clients: the SDK's exporter against the rotated certificate.
        send_logs(GrpcLogExporter(endpoint=f"https://{serve.grpc}", credentials=grpc.ssl_channel_credentials(
            root_certificates=ca.pem())), ["after the rotation"], "rotation.after")
        wait_until("the line", lambda: "after the rotation" in lines(serve, {}))
    finally:
        serve.kill()


def test_client_certificates_when_required(tmp_path):
    ca, ca_path, cert, key, _ = setup_tls(tmp_path)
    other = Ca("someone else")
    good_c, good_k, _ = ca.write_leaf(str(tmp_path), "client", "client")
    bad_c, bad_k, _ = other.write_leaf(str(tmp_path), "intruder", "intruder")
    old_c, old_k, _ = ca.write_leaf(str(tmp_path), "expired", "expired", expired=True)
    serve = Serve("--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca_path, ca=ca_path,
                  client_cert=(good_c, good_k))
    try:
        def ready(ctx):
            with urllib.request.urlopen(f"https://{serve.query}/ready", timeout=5, context=ctx) as r:
                return r.status == 200
        for c, k in [(None, None), (bad_c, bad_k), (old_c, old_k)]:
            ctx = ssl.create_default_context(cafile=ca_path)
            if c:
                ctx.load_cert_chain(c, k)
            let_in = True
            try:
                ready(ctx)
            except (ssl.SSLError, urllib.error.URLError, ConnectionError):
                let_in = False
            assert not let_in, f"{c} was let in"
        # The SDK's HTTP exporter with its client certificate.
        send_logs(HttpLogExporter(endpoint=f"https://{serve.http}/v1/logs", certificate_file=ca_path,
                                  client_certificate_file=good_c, client_key_file=good_k), ["mutual tls"], "mtls")
        wait_until("the line", lambda: "mutual tls" in lines(serve, {}))
    finally:
        serve.kill()


def test_trusted_header_believes_only_the_gateway(tmp_path):
    gateway_elsewhere = Serve("--auth", "trusted-header", "--auth-trusted-proxies", "10.9.9.0/24")
    try:
        status, body = gateway_elsewhere.api("logs", headers={"X-Scope-OrgID": "acme"})
        assert status == 401 and "trusted proxy" in body["error"], body
        assert otlp_plain(gateway_elsewhere, {"X-Scope-OrgID": "acme"}) == 401
    finally:
        gateway_elsewhere.kill()
    gateway_here = Serve("--auth", "trusted-header", "--auth-trusted-proxies", "127.0.0.1,::1")
    try:
        assert otlp_plain(gateway_here, {"X-Scope-OrgID": "acme"}) == 200
        assert gateway_here.api("logs", headers={"X-Scope-OrgID": "acme"})[0] == 200
        assert gateway_here.api("logs", headers={"X-Scope-OrgID": "a/../b"})[0] == 400
    finally:
        gateway_here.kill()


def otlp_plain(serve, headers):
    req = urllib.request.Request(f"http://{serve.http}/v1/logs", data=b"", method="POST",
                                 headers={"Content-Type": "application/x-protobuf", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_none_beyond_loopback_is_warned_about(tmp_path):
    serve = Serve(http_host="0.0.0.0")
    try:
        wait_until("the warning", lambda: "beyond loopback" in serve.log())
    finally:
        serve.kill()


def test_loadgen_sends_its_token(tmp_path):
    import re
    import subprocess

    from serve_proc import MIRA
    tokens = str(tmp_path / "tokens.toml")
    write_tokens(tokens, ["writer-acme"])
    serve = Serve("--auth", "tokens", "--auth-tokens-file", tokens)
    try:
        def acked(*extra):
            out = subprocess.run([MIRA, "loadgen", "--target", serve.grpc, "--protocol", "grpc", "--conns", "1",
                                  "--batch", "10", "--for", "1", "--rate", "20", *extra],
                                 capture_output=True, text=True, timeout=120, check=True).stdout
            return int(re.search(r"acked (\d+) requests", out).group(1))
        assert acked("--tenant", "acme", "--token", token("writer-acme")) > 0
        assert acked("--tenant", "acme") == 0
        assert acked("--tenant", "beta", "--token", token("writer-acme")) == 0
    finally:
        serve.kill()
