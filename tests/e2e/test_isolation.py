"""Tenant isolation, tested as an attacker would (docs/security.md): two
tenants' logs, traces and metrics in one `mira serve --auth tokens`; each
tenant's token asks every API (native, Loki, Tempo, Prometheus: queries,
labels, values, series, tags, trace by id, search, tail, cursors,
exemplars, stats), twice so the second answer comes from warm caches
(block, sidecar and decoded-table caches, label resolutions), and no answer
holds a row, label, value, trace id or count of the other tenant. The
other tenant's trace id is 404; a cursor minted for one tenant is refused
to the other; a token asking for the other tenant is 403."""

import asyncio
import base64
import hashlib
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import websockets

sys.path.insert(0, os.path.dirname(__file__))
from certs import write_atomic  # noqa: E402
from serve_proc import Serve, wait_until  # noqa: E402

TOKENS = {"acme": "tok-acme-0123456789", "beta": "tok-beta-9876543210"}
TRACE = {"acme": "a1" * 16, "beta": "b2" * 16}
N = 12


def auth(tenant, token_of=None):
    return {"Authorization": f"Bearer {TOKENS[token_of or tenant]}", "X-Scope-OrgID": tenant}


def kv(k, v):
    return {"key": k, "value": {"stringValue": v}}


def exports(tenant, now_ns):
    res = {"attributes": [kv("service.name", f"svc-{tenant}"), kv(f"{tenant}_res_key", f"{tenant}-res-val")]}
    logs = {"resourceLogs": [{"resource": res, "scopeLogs": [{"logRecords": [
        {"timeUnixNano": str(now_ns - i * 1_000_000), "severityText": "WARN", "severityNumber": 13,
         "body": {"stringValue": f"{tenant}-secret-line-{i}"}, "traceId": TRACE[tenant],
         "attributes": [kv(f"{tenant}_only_key", f"{tenant}-value-{i % 3}")]} for i in range(N)]}]}]}
    spans = {"resourceSpans": [{"resource": res, "scopeSpans": [{"spans": [
        {"traceId": TRACE[tenant], "spanId": f"{i + 1:016x}", "name": f"{tenant}-operation-{i}", "kind": 2,
         "startTimeUnixNano": str(now_ns - 5_000_000_000 + i), "endTimeUnixNano": str(now_ns - 4_000_000_000 + i),
         "attributes": [kv(f"{tenant}_span_key", f"{tenant}-span-value")]} for i in range(4)]}]}]}
    metrics = {"resourceMetrics": [{"resource": res, "scopeMetrics": [{"metrics": [
        {"name": f"{tenant}_requests", "sum": {"aggregationTemporality": 2, "isMonotonic": True, "dataPoints": [
            {"timeUnixNano": str(now_ns - i * 10_000_000_000), "startTimeUnixNano": str(now_ns - 3_600_000_000_000),
             "asDouble": float(100 - i), "attributes": [kv(f"{tenant}_label", f"{tenant}-label-value")],
             "exemplars": [{"timeUnixNano": str(now_ns - i * 10_000_000_000), "asDouble": 1.0,
                            "traceId": TRACE[tenant], "spanId": "0000000000000001"}]}
            for i in range(6)]}}]}]}]}
    return {"logs": logs, "traces": spans, "metrics": metrics}


def post_json(serve, signal, body, headers):
    req = urllib.request.Request(f"http://{serve.http}/v1/{signal}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def raw_get(serve, path, headers, **params):
    """(status, body text) of a GET on the query port."""
    url = f"http://{serve.query}{path}?{urllib.parse.urlencode(params, doseq=True)}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as r:
            return r.status, r.read().decode("latin-1")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("latin-1")


def requests(now_s):
    """Every read API, as (path, params, status wanted)."""
    start, end = now_s - 3600, now_s + 60
    ns = {"start": str(start * 10**9), "end": str(end * 10**9)}
    s = {"start": str(start), "end": str(end)}
    sel = '{service_name=~".+"}'
    out = [
        # native
        ("/api/mira/v1/logs", {**ns, "limit": "1000"}, 200),
        ("/api/mira/v1/traces/search", {**ns, "limit": "100"}, 200),
        ("/api/mira/v1/metrics/query", {"query": 'count({__name__=~".+"})', "time": str(now_s)}, 200),
        ("/api/mira/v1/metrics/query_range", {"query": '{__name__=~".+"}', **s, "step": "60"}, 200),
    ]
    for signal in ("logs", "traces", "metrics"):
        out += [("/api/mira/v1/labels", {**ns, "signal": signal}, 200),
                ("/api/mira/v1/label/service.name/values", {**ns, "signal": signal}, 200)]
    out += [
        # Loki
        ("/loki/api/v1/query_range", {"query": sel, **s, "limit": "1000"}, 200),
        ("/loki/api/v1/query_range", {"query": f"sum by (service_name) (count_over_time({sel}[1h]))", **s,
                                      "step": "60"}, 200),
        ("/loki/api/v1/query", {"query": f"count_over_time({sel}[1h])", "time": str(now_s)}, 200),
        ("/loki/api/v1/labels", s, 200),
        ("/loki/api/v1/label/service_name/values", s, 200),
        ("/loki/api/v1/series", {"match[]": sel, **s}, 200),
        ("/loki/api/v1/index/stats", {"query": sel, **s}, 200),
        ("/loki/api/v1/index/volume", {"query": sel, **s}, 200),
        ("/loki/api/v1/index/volume_range", {"query": sel, **s, "step": "60"}, 200),
        # Tempo
        ("/api/search", {**s, "limit": "100"}, 200),
        ("/api/search", {"q": "{}", **s, "limit": "100"}, 200),
        ("/api/search/tags", s, 200),
        ("/api/v2/search/tags", s, 200),
        ("/api/search/tag/service.name/values", s, 200),
        ("/api/v2/search/tag/resource.service.name/values", s, 200),
        # Prometheus
        ("/api/v1/query", {"query": '{__name__=~".+"}', "time": str(now_s)}, 200),
        ("/api/v1/query_range", {"query": '{__name__=~".+"}', **s, "step": "60"}, 200),
        ("/api/v1/labels", s, 200),
        ("/api/v1/label/__name__/values", s, 200),
        ("/api/v1/series", {"match[]": '{__name__=~".+"}', **s}, 200),
        ("/api/v1/metadata", {}, 200),
        ("/api/v1/query_exemplars", {"query": '{__name__=~".+"}', **s}, 200),
    ]
    return out


def tail(serve, tenant, now_s, want):
    """Lines a Loki tail (WebSocket) sends `tenant` until `want` arrived."""
    async def run():
        q = urllib.parse.urlencode({"query": '{service_name=~".+"}', "start": str((now_s - 3600) * 10**9),
                                    "limit": "1000"})
        got = []
        async with websockets.connect(f"ws://{serve.query}/loki/api/v1/tail?{q}",
                                      additional_headers=auth(tenant)) as ws:
            deadline = time.monotonic() + 60
            while not want <= set(got):
                assert time.monotonic() < deadline, f"tail sent {got}"
                msg = json.loads(await asyncio.wait_for(ws.recv(), timeout=60))
                for stream in msg.get("streams", []):
                    got += [line for _, line in stream["values"]]
        return got
    return asyncio.run(run())


def test_neither_tenant_sees_anything_of_the_other(tmp_path):
    tokens = tmp_path / "tokens.toml"
    text = ""
    for t, tok in TOKENS.items():
        text += (f'[[token]]\nname = "{t}"\nsha256 = "{hashlib.sha256(tok.encode()).hexdigest()}"\n'
                 f'tenants = ["{t}"]\nscopes = ["read", "write"]\n\n')
    write_atomic(str(tokens), text.encode())
    serve = Serve("--auth", "tokens", "--auth-tokens-file", str(tokens), "--seal-age", "1s")
    try:
        now_ns = time.time_ns()
        now_s = now_ns // 10**9
        for t in TOKENS:
            for signal, body in exports(t, now_ns).items():
                assert post_json(serve, signal, body, auth(t)) == 200
        own_lines = {t: {f"{t}-secret-line-{i}" for i in range(N)} for t in TOKENS}

        def sees_own(t):
            status, body = raw_get(serve, "/api/mira/v1/logs", auth(t), start=str((now_s - 3600) * 10**9),
                                   end=str((now_s + 60) * 10**9), limit="1000")
            return status == 200 and all(line in body for line in own_lines[t])

        for t in TOKENS:
            wait_until(f"{t}'s logs", lambda t=t: sees_own(t))
            wait_until(f"{t}'s trace", lambda t=t: raw_get(serve, f"/api/traces/{TRACE[t]}", auth(t))[0] == 200)
            wait_until(f"{t}'s metrics", lambda t=t: f"{t}_requests" in raw_get(
                serve, "/api/v1/label/__name__/values", auth(t))[1])

        for me, other in (("acme", "beta"), ("beta", "acme")):
            # Twice each, alternating tenants: the second round is served
            # from the caches the other tenant's queries warmed too.
            for _ in range(2):
                for path, params, want in requests(now_s):
                    status, body = raw_get(serve, path, auth(me), **params)
                    assert status == want, (me, path, params, status, body[:500])
                    assert other not in body and TRACE[other] not in body, (me, path, body[:2000])
                    status, body = raw_get(serve, path, auth(other), **params)
                    assert me not in body and TRACE[me] not in body, (other, path, body[:2000])
            # The other tenant's trace id: 404, on every trace-by-id path.
            for path in (f"/api/traces/{TRACE[other]}", f"/api/v2/traces/{TRACE[other]}",
                         f"/api/mira/v1/traces/{TRACE[other]}"):
                status, body = raw_get(serve, path, auth(me))
                assert status == 404, (me, path, status, body[:300])
                assert other not in body
            # Counts: one series of this tenant's, its lines only.
            status, body = raw_get(serve, "/api/v1/query", auth(me), query='count({__name__=~".+"})', time=str(now_s))
            assert status == 200 and json.loads(body)["data"]["result"][0]["value"][1] == "1", body
            status, body = raw_get(serve, "/loki/api/v1/index/stats", auth(me), query='{service_name=~".+"}',
                                   start=str(now_s - 3600), end=str(now_s + 60))
            assert status == 200 and json.loads(body)["entries"] == N, body
            # A cursor minted for `me` is refused to `other`.
            params = {"start": str((now_s - 3600) * 10**9), "end": str((now_s + 60) * 10**9), "limit": "2"}
            status, body = raw_get(serve, "/api/mira/v1/logs", auth(me), **params)
            cursor = json.loads(body)["cursor"]
            assert cursor, body
            status, body = raw_get(serve, "/api/mira/v1/logs", auth(me), cursor=cursor, **params)
            assert status == 200 and other not in body
            status, body = raw_get(serve, "/api/mira/v1/logs", auth(other), cursor=cursor, **params)
            assert status == 400 and "not issued to this tenant" in body, body
            # Asking for the other tenant with my token: 403, the same words
            # as for a tenant that does not exist.
            as_other = raw_get(serve, "/api/mira/v1/logs", auth(other, token_of=me))
            as_nobody = raw_get(serve, "/api/mira/v1/logs",
                                {"Authorization": f"Bearer {TOKENS[me]}", "X-Scope-OrgID": "nobody"})
            assert as_other[0] == 403 and as_other == as_nobody, (as_other, as_nobody)
            # Writing as the other tenant: 403 too.
            try:
                post_json(serve, "logs", exports(other, now_ns)["logs"], auth(other, token_of=me))
                raise AssertionError("wrote to another tenant")
            except urllib.error.HTTPError as e:
                assert e.code == 403
            # The Loki tail sends only this tenant's lines.
            got = tail(serve, me, now_s, own_lines[me])
            assert not any(other in line for line in got), got
    finally:
        serve.kill()
