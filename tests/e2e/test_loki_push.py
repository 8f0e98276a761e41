"""Loki push into a real `mira serve`: a real Python Loki client from PyPI
(`python-logging-loki`, JSON), a Promtail-style snappy protobuf body with
structured metadata, and gzip JSON. Each line must answer LogQL with the
labels Loki gives it (its stream labels, `service_name` discovered as
Loki 3 does, structured metadata); hostile bodies get Loki's status and
words, and the lines acknowledged before are all still there."""

import gzip
import json
import logging
import time
import urllib.error
import urllib.parse
import urllib.request

import cramjam
import logging_loki
import pytest

from serve_proc import Serve, field, get_json, varint, wait_until


@pytest.fixture(scope="module")
def serve():
    s = Serve()
    yield s
    s.kill()


def push(serve, body, content_type, encoding=None, tenant=None):
    headers = {"Content-Type": content_type}
    if encoding:
        headers["Content-Encoding"] = encoding
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(f"http://{serve.http}/loki/api/v1/push", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def query(serve, q, start_ns, end_ns, tenant=None):
    params = urllib.parse.urlencode({"query": q, "start": start_ns, "end": end_ns, "limit": 1000})
    headers = {"X-Scope-OrgID": tenant} if tenant else None
    status, body = get_json(f"http://{serve.query}/loki/api/v1/query_range?{params}", headers=headers)
    assert status == 200, body
    return {(tuple(sorted(s["stream"].items())), v[1]) for s in body["data"]["result"] for v in s["values"]}


def protobuf_push(streams):
    """`logproto.PushRequest`: [(labels text, [(ns, line, {metadata})])]."""
    out = b""
    for labels, entries in streams:
        s = field(1, labels.encode())
        for ns, line, meta in entries:
            ts = b"\x08" + varint(ns // 10**9) + b"\x10" + varint(ns % 10**9)
            e = field(1, ts) + field(2, line.encode())
            for k, v in meta.items():
                e += field(3, field(1, k.encode()) + field(2, v.encode()))
            s += field(2, e)
        out += field(1, s)
    return out


def test_a_python_loki_client_pushes_lines_loki_would_label_the_same(serve):
    start = time.time_ns()
    handler = logging_loki.LokiHandler(url=f"http://{serve.http}/loki/api/v1/push",
                                       tags={"application": "e2e-py"}, version="1")
    log = logging.getLogger("e2e.loki")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    failures = []
    handler.handleError = lambda record: failures.append(record)
    for i in range(5):
        log.warning("python line %d", i, extra={"tags": {"request": f"r{i % 2}"}})
    assert not failures, "the client's pushes were refused"
    end = time.time_ns() + 10**9
    want = {((("application", "e2e-py"), ("detected_level", "warn"), ("logger", "e2e.loki"), ("request", f"r{i % 2}"),
              ("service_name", "e2e-py"), ("severity", "warning")), f"python line {i}") for i in range(5)}
    wait_until("the client's lines answer", lambda: query(serve, '{application="e2e-py"}', start, end) == want)
    assert query(serve, '{application="e2e-py", request="r1"}', start, end) == {w for w in want if ("request", "r1") in w[0]}
    assert query(serve, '{service_name="e2e-py"} |= "line 3"', start, end) == {w for w in want if w[1] == "python line 3"}


def test_snappy_protobuf_and_gzip_json_pushes_answer_logql(serve):
    now = time.time_ns()
    body = protobuf_push([
        ('{app="web", env="prod"}', [(now, "GET /cart 200", {"user": "u1", "trace_id": "0af7651916cd43dd"}),
                                      (now + 1, "GET /cart 500", {"user": "u2"})]),
        ('{job="ns/batch"}', [(now + 2, "batch done", {})]),
    ])
    status, text = push(serve, bytes(cramjam.snappy.compress_raw(body)), "application/x-protobuf")
    assert status == 204, text
    j = {"streams": [{"stream": {"app": "web", "env": "dev"}, "values": [[str(now + 3), "json line", {"user": "u3"}]]}]}
    status, text = push(serve, gzip.compress(json.dumps(j).encode()), "application/json", encoding="gzip")
    assert status == 204, text
    start, end = now - 10**9, now + 10**10
    web = (("app", "web"), ("env", "prod"), ("service_name", "web"))
    unknown = (("detected_level", "unknown"),)
    wait_until("the pushed lines answer", lambda: len(query(serve, '{app="web"}', start, end)) == 3)
    assert query(serve, '{app="web", env="prod"} | user="u1"', start, end) == {
        (tuple(sorted(web + unknown + (("trace_id", "0af7651916cd43dd"), ("user", "u1")))), "GET /cart 200")}
    assert query(serve, '{job="ns/batch"}', start, end) == {
        ((("detected_level", "unknown"), ("job", "ns/batch"), ("service_name", "ns/batch")), "batch done")}
    assert query(serve, '{env="dev"}', start, end) == {
        ((("app", "web"), ("detected_level", "unknown"), ("env", "dev"), ("service_name", "web"), ("user", "u3")),
         "json line")}


def test_hostile_pushes_get_lokis_answers_and_lose_nothing(serve):
    now = time.time_ns()
    good = protobuf_push([('{app="kept"}', [(now, "kept line", {})])])
    assert push(serve, bytes(cramjam.snappy.compress_raw(good)), "application/x-protobuf")[0] == 204
    many = "{" + ", ".join(f'l{i:02}="v"' for i in range(16)) + "}"
    cases = [
        (bytes(cramjam.snappy.compress_raw(b"\0" * (20 << 20))), "application/x-protobuf", None, 413, "exceeds"),
        (varint(1 << 31) + b"\0" * 8, "application/x-protobuf", None, 413, "exceeds"),
        (b"\x10garbage", "application/x-protobuf", None, 400, "malformed snappy body"),
        (bytes(cramjam.snappy.compress_raw(b"\x0a\x7f\x0a")), "application/x-protobuf", None, 400,
         "malformed Loki push request"),
        (bytes(cramjam.snappy.compress_raw(protobuf_push([("{}", [(now, "x", {})])]))), "application/x-protobuf",
         None, 400, "at least one label pair is required per stream"),
        (bytes(cramjam.snappy.compress_raw(protobuf_push([('{a="1", a="2"}', [(now, "x", {})])]))),
         "application/x-protobuf", None, 400, "has duplicate label name: 'a'"),
        (bytes(cramjam.snappy.compress_raw(protobuf_push([('{a-b="1"}', [(now, "x", {})])]))),
         "application/x-protobuf", None, 400, "error parsing labels"),
        (bytes(cramjam.snappy.compress_raw(protobuf_push([(many, [(now, "x", {})])]))),
         "application/x-protobuf", None, 400, "has 16 label names; limit 15"),
        (bytes(cramjam.snappy.compress_raw(protobuf_push([('{app="x"}', [(now - 40 * 86400 * 10**9, "x", {})])]))),
         "application/x-protobuf", None, 400, "has timestamp too old"),
        (bytes(cramjam.snappy.compress_raw(protobuf_push([('{app="x"}', [(now, "y" * (256 * 1024 + 1), {})])]))),
         "application/x-protobuf", None, 400, "Max entry size '262144' bytes exceeded"),
        (b'{"streams": [{"stream": {"a": 1}}]}', "application/json", None, 400, "invalid Loki push JSON"),
        (b"{}", "text/plain", None, 415, "unsupported content type"),
    ]
    for body, ctype, enc, want_status, words in cases:
        status, text = push(serve, body, ctype, encoding=enc)
        assert status == want_status and words in text, (body[:40], status, text)
    start, end = now - 10**9, now + 10**10
    assert query(serve, '{app="kept"}', start, end) == {
        ((("app", "kept"), ("detected_level", "unknown"), ("service_name", "kept")), "kept line")}
    assert serve.proc.poll() is None


def test_a_tenants_limits_file_moves_lokis_label_and_line_limits(tmp_path):
    """`loki_max_label_names_per_series` and `loki_max_line_size` in the
    limits file (docs/security.md): a tenant with its own values is held to
    them, another to Loki's defaults, each with Loki's words."""
    limits = tmp_path / "limits.toml"
    limits.write_text('[tenants.wide]\nloki_max_label_names_per_series = 20\nloki_max_line_size = "1KiB"\n')
    s = Serve("--limits-file", str(limits))
    try:
        now = time.time_ns()
        many = "{" + ", ".join(f'l{i:02}="v"' for i in range(16)) + "}"
        body = bytes(cramjam.snappy.compress_raw(protobuf_push([
            (many, [(now, "sixteen labels", {})]),
            ('{app="long"}', [(now + 1, "z" * 2000, {}), (now + 2, "short", {})]),
        ])))
        answers = {t: push(s, body, "application/x-protobuf", tenant=t) for t in ("wide", "other")}
        assert answers["wide"][0] == 400 and "Max entry size '1024' bytes exceeded" in answers["wide"][1], answers
        assert answers["other"][0] == 400 and "has 16 label names; limit 15" in answers["other"][1], answers
        start, end = now - 10**9, now + 10**10
        lines = {t: lambda t=t: sorted(v[1] for q in ('{l00="v"}', '{app="long"}')
                                       for v in query(s, q, start, end, tenant=t))
                 for t in answers}
        wait_until("wide's lines answer", lambda: lines["wide"]() == ["short", "sixteen labels"])
        wait_until("other's lines answer", lambda: lines["other"]() == sorted(["short", "z" * 2000]))
        assert s.proc.poll() is None
    finally:
        s.kill()
