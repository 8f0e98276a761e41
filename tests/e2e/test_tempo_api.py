"""Tempo's trace-by-id and tag endpoints as Grafana's Tempo data source
calls them, against `mira serve` fed by the OpenTelemetry Python SDK:
`/api/v2/traces/{id}` decodes as `tempopb.TraceByIDResponse` (field 1 is the
trace, wire-identical to OTLP `TracesData`), `/api/traces/{id}` as
`TracesData`, an unknown id is 404 on both, and tag names and values list
what was sent, per scope."""

import json
import urllib.error
import urllib.request

import pytest
from google.protobuf.internal.decoder import _DecodeVarint
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from serve_proc import Serve, wait_until


def get(serve, path, accept="application/protobuf", tenant=None):
    headers = {"Accept": accept}
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(f"http://{serve.query}{path}", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read()


@pytest.fixture(scope="module")
def traced():
    s = Serve()
    try:
        provider = TracerProvider(resource=Resource.create({"service.name": "shop", "deployment.environment": "e2e"}))
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=s.grpc, insecure=True)))
        tracer = provider.get_tracer("e2e")
        with tracer.start_as_current_span("checkout", attributes={"http.method": "POST"}) as root:
            with tracer.start_as_current_span("reserve", attributes={"warehouse": "b7"}):
                pass
            with tracer.start_as_current_span("charge"):
                pass
            trace_id = format(root.get_span_context().trace_id, "032x")
        provider.shutdown()
        wait_until("the trace", lambda: get(s, f"/api/traces/{trace_id}")[0] == 200)
        yield s, trace_id
    finally:
        s.kill()


def test_echo_and_buildinfo_pass_grafanas_checks(traced):
    serve, _ = traced
    status, _, body = get(serve, "/api/echo", accept="*/*")
    assert (status, body) == (200, b"echo")
    status, _, body = get(serve, "/api/status/buildinfo", accept="application/json")
    info = json.loads(body)
    # A plain semver below 2.2: Grafana keeps gRPC streaming (not served) off.
    major, minor, patch = (int(x) for x in info["version"].split("."))
    assert status == 200 and (major, minor) < (2, 2), info


def test_v2_trace_by_id_is_a_trace_by_id_response(traced):
    serve, trace_id = traced
    status, ctype, body = get(serve, f"/api/v2/traces/{trace_id}")
    assert status == 200 and ctype == "application/protobuf"
    # TraceByIDResponse: field 1 (tag 0x0A), length-delimited, holding the
    # trace; nothing else (status COMPLETE is the default and omitted).
    assert body[0] == 0x0A
    length, pos = _DecodeVarint(body, 1)
    assert pos + length == len(body), "one field only"
    trace = TracesData.FromString(body[pos:])
    spans = [s for rs in trace.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sorted(s.name for s in spans) == ["charge", "checkout", "reserve"]
    assert all(s.trace_id.hex() == trace_id for s in spans)
    service = {a.value.string_value for rs in trace.resource_spans for a in rs.resource.attributes
               if a.key == "service.name"}
    assert service == {"shop"}


def test_v1_trace_by_id_is_traces_data_and_ids_may_be_short_or_upper_case(traced):
    serve, trace_id = traced
    status, _, body = get(serve, f"/api/traces/{trace_id.upper()}")
    assert status == 200
    spans = [s for rs in TracesData.FromString(body).resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert len(spans) == 3
    # The same bytes as v2's field 1.
    _, _, v2 = get(serve, f"/api/v2/traces/{trace_id}")
    length, pos = _DecodeVarint(v2, 1)
    assert v2[pos:] == body
    # JSON on request, as Tempo serves it.
    status, _, j = get(serve, f"/api/v2/traces/{trace_id}", accept="application/json")
    assert status == 200 and len(json.loads(j)["trace"]["resourceSpans"]) >= 1
    status, _, j = get(serve, f"/api/traces/{trace_id}", accept="application/json")
    assert status == 200 and json.loads(j)["batches"]


def test_an_unknown_or_foreign_trace_is_404_and_a_bad_id_400(traced):
    serve, trace_id = traced
    for path in ("/api/v2/traces/", "/api/traces/"):
        assert get(serve, path + "0" * 31 + "1")[0] == 404
        # Short ids are padded with zeros on the left, as Tempo does: still unknown.
        assert get(serve, path + "abc")[0] == 404
        # Another tenant does not see this tenant's trace.
        assert get(serve, path + trace_id, tenant="other")[0] == 404
        for bad in ("x" * 32, "1" * 33, "%20"):
            status, _, body = get(serve, path + bad)
            assert status == 400 and b"hex" in body, (bad, body)
    status, _, body = get(serve, f"/api/v2/traces/{trace_id}?start=200&end=100")
    assert status == 400, body
    # The querier keeps serving.
    assert get(serve, f"/api/v2/traces/{trace_id}")[0] == 200


def test_tags_and_values_list_what_was_sent_by_scope(traced):
    serve, _ = traced
    status, _, body = get(serve, "/api/v2/search/tags", accept="application/json")
    scopes = {s["name"]: s["tags"] for s in json.loads(body)["scopes"]}
    assert status == 200
    assert {"service.name", "deployment.environment"} <= set(scopes["resource"]), scopes
    assert {"http.method", "warehouse"} <= set(scopes["span"]), scopes
    assert {"duration", "name", "status", "kind"} <= set(scopes["intrinsic"])
    _, _, body = get(serve, "/api/v2/search/tags?scope=span", accept="application/json")
    assert [s["name"] for s in json.loads(body)["scopes"]] == ["span"]
    _, _, body = get(serve, "/api/search/tags", accept="application/json")
    assert {"service.name", "http.method"} <= set(json.loads(body)["tagNames"])

    def values(path):
        status, _, body = get(serve, path, accept="application/json")
        assert status == 200, body
        return json.loads(body)["tagValues"]

    assert values("/api/v2/search/tag/resource.service.name/values") == [{"type": "string", "value": "shop"}]
    assert values("/api/v2/search/tag/span.warehouse/values") == [{"type": "string", "value": "b7"}]
    assert values("/api/v2/search/tag/.http.method/values") == [{"type": "string", "value": "POST"}]
    # Grafana encodes the tag twice; the proxy decodes once: `%2E` arrives.
    assert values("/api/v2/search/tag/resource%2Eservice%2Ename/values") == [{"type": "string", "value": "shop"}]
    assert {v["value"] for v in values("/api/v2/search/tag/status/values")} == {"error", "ok", "unset"}
    # A v1 tag has no scope: any scope's values.
    assert values("/api/search/tag/service.name/values") == ["shop"]
    assert values("/api/search/tag/resource.service.name/values") == ["shop"]
    # Another tenant sees none of it.
    _, _, body = get(serve, "/api/v2/search/tags", accept="application/json", tenant="other")
    scopes = {s["name"]: s["tags"] for s in json.loads(body)["scopes"]}
    assert scopes["resource"] == [] and scopes["span"] == []
