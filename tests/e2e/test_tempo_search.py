"""Tempo's TraceQL search (`GET /api/search`) as Grafana's Tempo data source
calls it, against `mira serve` fed exact OTLP protobufs over OTLP/HTTP.

Every answer is compared with one computed here, independently of Mira, by
a small TraceQL parser and evaluator (`TraceQL` below) over the spans this
module sent: which traces, in which order, the span sets of each with their
`matched` counts, the spans returned (at most `spss`, newest first) and
their attributes, in the exact JSON types Grafana's Go decoder needs
(design/grafana-api.md B3: `startTimeUnixNano` and `durationNanos` strings,
`durationMs` and `matched` integers, `intValue` a string).

Two processes:
- `sealed`: `--seal-age 1s`; the data is waited on until every block is
  sealed and published, so the searches read published blocks (pruned by
  zone maps, the attribute index and Bloom filters). It also holds a tenant
  sent in three single-service batches, one sealed block set each, for the
  pruning check.
- `fresh`: the default seal age, so the same data is answered from the
  ingester's open blocks (read-your-writes); tenant isolation and hostile
  input run there too.

Semantics (the brief of issue 12's TraceQL work): a trace starts as one
span set of all its spans; `{cond}` keeps the spans where `cond` holds;
comparisons are typed (a string never equals a number; ints and floats mix;
`x != nil` iff x exists, `x = nil` iff missing, anything else with a
missing attribute is false); regexes are anchored; `{a} && {b}` and
`{a} || {b}` give the union of their spans; structural operators keep the
right-hand spans related to a left-hand one; a trace is searched when one
of its spans starts in the window, and then all its spans count.
"""

import json
import math
import random
import re
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from serve_proc import Serve, wait_until

MS = 1_000_000
SEC = 1_000_000_000

# ---------------------------------------------------------------------------
# The dataset: ~40 traces over 3 services, nested spans (depth up to 4) of
# every kind and status, durations 1 ms - 2 s, span attributes of four types.
# Trace i starts in its own 30 s slot, so "newest first" is unambiguous.
# ---------------------------------------------------------------------------

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}
STATUSES = {0: "unset", 1: "ok", 2: "error"}
SERVICES = ["checkout", "payments", "inventory"]
RESOURCES = {
    "checkout": {"deployment.environment": ("str", "prod"), "host.cpus": ("int", 4)},
    "payments": {"deployment.environment": ("str", "prod"), "region": ("str", "eu-west"), "host.cpus": ("int", 8)},
    "inventory": {"deployment.environment": ("str", "staging"), "host.cpus": ("int", 2)},
}
NAMES = {
    ("checkout", 2): ["POST /pay", "GET /cart", "POST /order"],
    ("checkout", 3): ["call payments", "call inventory"],
    ("checkout", 1): ["render", "validate"],
    ("checkout", 4): ["publish order"],
    ("checkout", 5): ["consume refund"],
    ("payments", 2): ["charge", "refund"],
    ("payments", 3): ["bank api"],
    ("payments", 1): ["fraud-check"],
    ("payments", 4): ["publish receipt"],
    ("payments", 5): ["consume order"],
    ("inventory", 2): ["reserve", "GET /stock"],
    ("inventory", 3): ["call warehouse"],
    ("inventory", 1): ["db.query", "dbXquery"],
    ("inventory", 4): ["publish stock"],
    ("inventory", 5): ["consume receipt"],
}
N_TRACES = 40
SLOT = 30 * SEC


class Sp:
    """One span as sent: what the evaluator reads and what OTLP carries."""

    def __init__(self, trace, sid, parent, service, name, kind, start, dur, code=0, msg="", attrs=None):
        self.trace, self.id, self.parent, self.service = trace, sid, parent, service
        self.name, self.kind, self.start, self.end = name, kind, start, start + dur
        self.code, self.msg, self.attrs = code, msg, dict(attrs or {})

    def resource(self):
        r = {"service.name": ("str", self.service)}
        r.update(RESOURCES.get(self.service, {}))
        return r


def span_id(rng):
    while True:
        b = rng.getrandbits(64).to_bytes(8, "big")
        if b != bytes(8):
            return b


def random_trace(rng, tid, t0):
    """A root server span and 1-3 children, each with up to 2 children, down
    to depth 4; a client's child is a server in another service, a
    producer's a consumer."""
    spans, starts = [], set()

    def unique(t):
        while t in starts:
            t += 1
        starts.add(t)
        return t

    def duration():
        return int(math.exp(rng.uniform(math.log(1 * MS), math.log(2000 * MS))))

    def attrs_for(service, kind):
        a = {}
        if kind == 2:
            a["http.method"] = ("str", rng.choice(["GET", "POST"]))
            if rng.random() < 0.85:
                a["http.status_code"] = ("int", rng.choice([200, 200, 200, 404, 500]))
        elif kind == 3:
            if rng.random() < 0.5:
                a["http.status_code"] = ("int", rng.choice([200, 503]))
            a["retry"] = ("bool", rng.random() < 0.3)
        elif kind == 1:
            if rng.random() < 0.5:
                a["db.rows"] = ("int", rng.randint(0, 500))
            if rng.random() < 0.5:
                a["cache.hit"] = ("bool", rng.random() < 0.5)
        elif kind == 4:
            a["messaging.system"] = ("str", "kafka")
        if service == "payments" and kind != 0 and rng.random() < 0.5:
            a["amount"] = ("float", rng.choice([19.5, 100.0, 3.25, 42.75]))
        if service == "checkout" and rng.random() < 0.3:
            a["region"] = ("str", "us-east")
        return a

    def status():
        r = rng.random()
        if r < 0.18:
            return 2, rng.choice(["", "card declined", "timeout after 3 retries", "connection reset"])
        if r < 0.38:
            return 1, "fine" if rng.random() < 0.1 else ""
        return 0, ""

    def add(parent, service, kind, depth, start):
        if kind == 0:
            name = "legacy"
        else:
            name = rng.choice(NAMES[(service, kind)])
        code, msg = status()
        s = Sp(tid, span_id(rng), parent.id if parent else b"", service, name, kind, unique(start), duration(),
               code, msg, {} if kind == 0 else attrs_for(service, kind))
        spans.append(s)
        if depth == 3:
            return
        n = rng.randint(1, 3) if depth == 0 else rng.choice([0, 0, 1, 1, 2])
        for _ in range(n):
            if kind == 3:
                ck = (rng.choice([x for x in SERVICES if x != service]), 2)
            elif kind == 4:
                ck = (rng.choice([x for x in SERVICES if x != service]), 5)
            else:
                r = rng.random()
                ck = (service, 3) if r < 0.45 else (service, 1) if r < 0.8 else (service, 4) if r < 0.92 else \
                    (service, 0)
            add(s, ck[0], ck[1], depth + 1, s.start + rng.randint(100_000, 30 * MS))

    add(None, rng.choice(SERVICES), 2, 0, t0)
    return spans


def handmade(rng, tid, t0, which):
    """Traces that make sure the interesting cases exist."""
    i = iter(range(1, 100))

    def at(ms):
        return t0 + int(ms * MS) + next(i)

    if which == "builder":
        root = Sp(tid, span_id(rng), b"", "checkout", "POST /pay", 2, at(0), 350 * MS, 2, "card declined",
                  {"http.method": ("str", "POST"), "http.status_code": ("int", 500)})
        call = Sp(tid, span_id(rng), root.id, "checkout", "call payments", 3, at(2), 320 * MS, 2, "",
                  {"http.status_code": ("int", 503), "retry": ("bool", True)})
        charge = Sp(tid, span_id(rng), call.id, "payments", "charge", 2, at(4), 300 * MS, 2, "card declined",
                    {"http.method": ("str", "POST"), "http.status_code": ("int", 500), "amount": ("float", 100.0)})
        return [root, call, charge]
    if which == "typed":
        # The builder's query with status_code the STRING "500": must not match.
        root = Sp(tid, span_id(rng), b"", "checkout", "POST /pay", 2, at(0), 400 * MS, 2, "upstream said 500",
                  {"http.method": ("str", "POST"), "http.status_code": ("str", "500")})
        v = Sp(tid, span_id(rng), root.id, "checkout", "validate", 1, at(1), 3 * MS, 0, "",
               {"cache.hit": ("str", "true")})
        return [root, v]
    if which == "short":
        # The builder's query but 80 ms: must not match duration>100ms.
        root = Sp(tid, span_id(rng), b"", "checkout", "POST /pay", 2, at(0), 80 * MS, 2, "",
                  {"http.method": ("str", "POST"), "http.status_code": ("int", 500)})
        return [root, Sp(tid, span_id(rng), root.id, "checkout", "render", 1, at(3), 20 * MS)]
    if which == "zeros":
        root = Sp(tid, bytes([0, 0, 0, 0, 0, 0, 0x0a, 0xbc]), b"", "checkout", "GET /cart", 2, at(0), 40 * MS, 1,
                  "", {"http.method": ("str", "GET"), "http.status_code": ("int", 200)})
        z = Sp(tid, bytes([0, 0, 0, 0, 0, 0, 0x12, 0x34]), root.id, "checkout", "zero-id-span", 1, at(5), 7 * MS)
        return [root, z]
    if which == "orphans":
        # No span without a parent id: the root is the earliest span.
        absent = bytes([0xde, 0xad, 0, 0, 0, 0, 0, 1])
        early = Sp(tid, span_id(rng), absent, "inventory", "orphan-early", 2, at(0), 90 * MS, 0, "",
                   {"http.status_code": ("int", 404)})
        late = Sp(tid, span_id(rng), early.id, "inventory", "orphan-late", 1, at(10), 30 * MS, 2, "",
                  {"db.rows": ("int", 0)})
        other = Sp(tid, span_id(rng), absent, "payments", "orphan-other", 5, at(20), 5 * MS)
        return [early, late, other]
    if which == "two-roots":
        # Two spans without a parent id: the root is the earlier of them.
        late_root = Sp(tid, span_id(rng), b"", "payments", "second-root", 2, at(3), 12 * MS, 0, "",
                       {"http.status_code": ("int", 200)})
        early_root = Sp(tid, span_id(rng), b"", "inventory", "first-root", 5, at(0), 30 * MS)
        child = Sp(tid, span_id(rng), late_root.id, "payments", "fraud-check", 1, at(4), 2 * MS, 1, "fine")
        return [late_root, early_root, child]
    if which == "window":
        # The root starts 100 ms into a whole second; the rest 1.5 s later,
        # outside a one-second window that holds the root.
        t = t0 - t0 % SEC + 100 * MS
        root = Sp(tid, span_id(rng), b"", "checkout", "GET /cart", 2, t, 2000 * MS, 0, "",
                  {"http.status_code": ("int", 200)})
        early = Sp(tid, span_id(rng), root.id, "checkout", "render", 1, t + 5 * MS, 10 * MS)
        late = Sp(tid, span_id(rng), root.id, "checkout", "late-child", 3, t + 1500 * MS, 900 * MS, 2, "late")
        later = Sp(tid, span_id(rng), late.id, "inventory", "reserve", 2, t + 1600 * MS, 700 * MS, 0, "",
                   {"http.status_code": ("int", 200)})
        return [root, early, late, later]
    if which == "payload":
        # A value that makes a backtracking regex engine explode.
        root = Sp(tid, span_id(rng), b"", "payments", "refund", 2, at(0), 60 * MS, 0, "",
                  {"http.status_code": ("int", 200), "amount": ("int", 100), "payload": ("str", "a" * 40 + "!")})
        return [root, Sp(tid, span_id(rng), root.id, "payments", "fraud-check", 1, at(2), 4 * MS)]
    if which == "region":
        # A span attribute shadows the resource attribute of the same name.
        root = Sp(tid, span_id(rng), b"", "payments", "charge", 2, at(0), 1800 * MS, 1, "",
                  {"http.status_code": ("int", 200), "region": ("str", "ap-south"), "amount": ("float", 42.75)})
        db = Sp(tid, span_id(rng), root.id, "payments", "fraud-check", 1, at(1), 1700 * MS, 0, "",
                {"db.rows": ("int", 12)})
        legacy = Sp(tid, span_id(rng), db.id, "payments", "legacy", 0, at(2), 1 * MS)
        return [root, db, legacy]
    raise KeyError(which)


HANDMADE = {5: "builder", 12: "typed", 20: "short", 3: "zeros", 27: "orphans", 33: "two-roots", 17: "window",
            9: "payload", 38: "region"}


def build_dataset(base, seed=20240611):
    rng = random.Random(seed)
    traces = []
    for i in range(N_TRACES):
        tid = rng.getrandbits(128).to_bytes(16, "big")
        if HANDMADE.get(i) == "zeros":
            tid = bytes(6) + tid[6:]
        t0 = base + i * SLOT + rng.randint(0, 400) * MS
        if i in HANDMADE:
            traces.append(handmade(rng, tid, t0, HANDMADE[i]))
        else:
            traces.append(random_trace(rng, tid, t0))
    return traces


def small_traces(base, seed, services, per_service, name):
    """Single-service traces of three spans (tenant and pruning checks)."""
    rng = random.Random(seed)
    out = []
    for n, svc in enumerate(services):
        for k in range(per_service):
            tid = rng.getrandbits(128).to_bytes(16, "big")
            t0 = base + (n * per_service + k) * SLOT + 15 * SEC + rng.randint(0, 400) * MS
            root = Sp(tid, span_id(rng), b"", svc, name, 2, t0, 200 * MS, 0, "", {"http.status_code": ("int", 200)})
            c = Sp(tid, span_id(rng), root.id, svc, "call", 3, t0 + MS, 150 * MS, 2 if k % 2 else 0)
            d = Sp(tid, span_id(rng), c.id, svc, "db.query", 1, t0 + 2 * MS, 20 * MS, 0, "",
                   {"db.rows": ("int", k)})
            out.append([root, c, d])
    return out


# ---------------------------------------------------------------------------
# OTLP
# ---------------------------------------------------------------------------

def any_value(tv):
    t, v = tv
    if t == "str":
        return AnyValue(string_value=v)
    if t == "int":
        return AnyValue(int_value=v)
    if t == "float":
        return AnyValue(double_value=v)
    if t == "bool":
        return AnyValue(bool_value=v)
    raise ValueError(t)


def export_request(traces):
    """One ResourceSpans per service (all the traces' spans of it)."""
    by_service = {}
    for spans in traces:
        for s in spans:
            by_service.setdefault(s.service, []).append(s)
    req = ExportTraceServiceRequest()
    for service, spans in by_service.items():
        res = Resource(attributes=[KeyValue(key=k, value=any_value(v)) for k, v in spans[0].resource().items()])
        otlp = []
        for s in spans:
            otlp.append(Span(trace_id=s.trace, span_id=s.id, parent_span_id=s.parent, name=s.name, kind=s.kind,
                             start_time_unix_nano=s.start, end_time_unix_nano=s.end,
                             attributes=[KeyValue(key=k, value=any_value(v)) for k, v in s.attrs.items()],
                             status=Status(code=s.code, message=s.msg)))
        req.resource_spans.append(ResourceSpans(
            resource=res, scope_spans=[ScopeSpans(scope=InstrumentationScope(name="e2e-search", version="1"),
                                                  spans=otlp)]))
    return req.SerializeToString()


def send(serve, traces, tenant=None):
    headers = {"Content-Type": "application/x-protobuf"}
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(f"http://{serve.http}/v1/traces", data=export_request(traces), method="POST",
                                 headers=headers)
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        body = r.read()
    # An OTLP partial success (rejected spans) carries a count; none allowed.
    assert b"rejected" not in body and len(body) < 4, body


def native_search(serve, start_ns, end_ns, tenant=None):
    headers = {"X-Scope-OrgID": tenant} if tenant else {}
    url = (f"http://{serve.query}/api/mira/v1/traces/search?"
           f"{urllib.parse.urlencode({'start': start_ns, 'end': end_ns, 'limit': 1000})}")
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        return json.loads(r.read())


def wait_sealed(serve, traces, tenant=None):
    """Until every trace sent is found and none of it is in an open block."""
    want = {spans[0].trace.hex() for spans in traces}
    lo = min(s.start for t in traces for s in t) - SEC
    hi = max(s.start for t in traces for s in t) + SEC

    def sealed():
        a = native_search(serve, lo, hi, tenant)
        return want <= {t["traceId"] for t in a["traces"]} and a["stats"]["recent_blocks"] == 0

    wait_until("the traces sealed and published", sealed, timeout=90)


# ---------------------------------------------------------------------------
# TraceQL, independently: a small parser and evaluator.
# ---------------------------------------------------------------------------

NIL = None
TRUE = ("bool", True)
INTRINSICS = {"name", "status", "statusMessage", "duration", "kind", "traceDuration", "rootName", "rootServiceName"}
COLON = {("span", "name"): "name", ("span", "status"): "status", ("span", "statusMessage"): "statusMessage",
         ("span", "duration"): "duration", ("span", "kind"): "kind", ("trace", "duration"): "traceDuration",
         ("trace", "rootName"): "rootName", ("trace", "rootService"): "rootServiceName"}
STRUCT = ["!>>", "!<<", ">>", "<<", "!>", "!<", ">", "<", "!~", "~"]
OPS = ["!>>", "!<<", "&&", "||", "!=", "!~", "!>", "!<", ">=", "<=", ">>", "<<", "=~",
       "{", "}", "(", ")", ",", "|", "!", "=", ">", "<", "~"]
UNITS = [("ns", 1), ("us", 1_000), ("µs", 1_000), ("ms", MS), ("s", SEC), ("m", 60 * SEC), ("h", 3600 * SEC)]
NAME_CHARS = re.compile(r"[A-Za-z0-9_.\-/]+")


class ParseError(Exception):
    pass


def lex(q):
    toks, i = [], 0
    while i < len(q):
        c = q[i]
        if c.isspace():
            i += 1
        elif c == '"':
            j, s = i + 1, []
            while q[j] != '"':
                if q[j] == "\\":
                    j += 1
                s.append(q[j])
                j += 1
            toks.append(("lit", ("str", "".join(s))))
            i = j + 1
        elif c.isdigit():
            m = re.compile(r"\d+(\.\d+)?").match(q, i)
            num, i = m.group(0), m.end()
            for unit, mult in sorted(UNITS, key=lambda u: -len(u[0])):
                if q.startswith(unit, i) and not (i + len(unit) < len(q) and q[i + len(unit)].isalpha()):
                    toks.append(("lit", ("dur", round(float(num) * mult))))
                    i += len(unit)
                    break
            else:
                toks.append(("lit", ("float", float(num)) if "." in num else ("int", int(num))))
        elif c == "." and i + 1 < len(q) and q[i + 1].isalpha():
            m = NAME_CHARS.match(q, i + 1)
            toks.append(("attr", ("unscoped", m.group(0))))
            i = m.end()
        elif c.isalpha():
            m = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(q, i)
            word, i = m.group(0), m.end()
            if word in ("span", "resource") and q.startswith(".", i):
                m = NAME_CHARS.match(q, i + 1)
                toks.append(("attr", (word, m.group(0))))
                i = m.end()
            elif q.startswith(":", i):
                m = re.compile(r"[A-Za-z]+").match(q, i + 1)
                toks.append(("attr", ("intrinsic", COLON[(word, m.group(0))])))
                i = m.end()
            else:
                toks.append(("word", word))
        else:
            for op in OPS:
                if q.startswith(op, i):
                    toks.append(("op", op))
                    i += len(op)
                    break
            else:
                raise ParseError(f"unexpected {c!r} at {i}")
    toks.append(("eof", None))
    return toks


class Parser:
    """query := pipeline; pipeline := spansets ('|' stage)*;
    spansets := struct (('&&'|'||') struct)*; struct := primary (structop primary)*;
    primary := '{' field? '}' | '(' pipeline ')'."""

    def __init__(self, q):
        self.t, self.i = lex(q), 0

    def peek(self):
        return self.t[self.i]

    def next(self):
        tok = self.t[self.i]
        self.i += 1
        return tok

    def op(self, *ops):
        tok = self.peek()
        if tok[0] == "op" and tok[1] in ops:
            self.i += 1
            return tok[1]
        return None

    def expect(self, op):
        if self.op(op) is None:
            raise ParseError(f"expected {op} at token {self.i}: {self.peek()}")

    def query(self):
        e = self.pipeline()
        if self.peek()[0] != "eof":
            raise ParseError(f"trailing {self.peek()}")
        return e

    def pipeline(self):
        e = self.spansets()
        stages = []
        while self.op("|"):
            stages.append(self.stage())
        return ("pipe", e, stages) if stages else e

    def spansets(self):
        left = self.struct()
        while (op := self.op("&&", "||")) is not None:
            left = ("and" if op == "&&" else "or", left, self.struct())
        return left

    def struct(self):
        left = self.primary()
        while (op := self.op(*STRUCT)) is not None:
            left = ("struct", op, left, self.primary())
        return left

    def primary(self):
        if self.op("{"):
            if self.op("}"):
                return ("filter", ("lit", TRUE))
            f = self.field()
            self.expect("}")
            return ("filter", f)
        self.expect("(")
        e = self.pipeline()
        self.expect(")")
        return e

    def stage(self):
        tok = self.peek()
        if tok[0] == "word" and tok[1] in ("count", "avg", "min", "max", "sum"):
            self.next()
            self.expect("(")
            arg = None if tok[1] == "count" else self.field()
            self.expect(")")
            op = self.op("=", "!=", ">", ">=", "<", "<=")
            lit = self.next()
            assert lit[0] == "lit", lit
            return ("scalar", tok[1], arg, op, lit[1])
        if tok[0] == "word" and tok[1] in ("select", "by", "coalesce"):
            self.next()
            self.expect("(")
            if tok[1] == "coalesce":
                self.expect(")")
                return ("coalesce",)
            if tok[1] == "by":
                f = self.field()
                self.expect(")")
                return ("by", f)
            attrs = [self.field()]
            while self.op(","):
                attrs.append(self.field())
            self.expect(")")
            return ("select", [a[1] for a in attrs])
        return ("stagefilter", self.spansets())

    def field(self):
        left = self.cmp()
        while (op := self.op("&&", "||")) is not None:
            left = ("and" if op == "&&" else "or", left, self.cmp())
        return left

    def cmp(self):
        left = self.unary()
        op = self.op("=", "!=", ">", ">=", "<", "<=", "=~", "!~")
        if op is None:
            return left
        return ("cmp", op, left, self.unary())

    def unary(self):
        if self.op("!"):
            return ("not", self.unary())
        if self.op("("):
            f = self.field()
            self.expect(")")
            return f
        tok = self.next()
        if tok[0] == "lit":
            return ("lit", tok[1])
        if tok[0] == "attr":
            return ("attr", tok[1])
        if tok[0] == "word":
            w = tok[1]
            if w in INTRINSICS:
                return ("attr", ("intrinsic", w))
            if w in STATUSES.values():
                return ("lit", ("status", w))
            if w in KINDS.values():
                return ("lit", ("kind", w))
            if w in ("true", "false"):
                return ("lit", ("bool", w == "true"))
            if w == "nil":
                return ("lit", NIL)
        raise ParseError(f"unexpected {tok}")


class TraceView:
    def __init__(self, spans):
        self.spans = spans
        self.by_id = {s.id: s for s in spans}
        self.parent = {s.id: (s.parent if s.parent in self.by_id and s.parent != s.id else None) for s in spans}
        self.children = {s.id: [] for s in spans}
        for s in spans:
            if self.parent[s.id] is not None:
                self.children[self.parent[s.id]].append(s.id)
        parentless = [s for s in spans if not s.parent]
        self.root = min(parentless or spans, key=lambda s: s.start)
        self.start = min(s.start for s in spans)
        self.end = max(s.end for s in spans)

    def ancestors(self, sid):
        seen = set()
        while (p := self.parent[sid]) is not None and p not in seen:
            seen.add(p)
            yield p
            sid = p


def numeric(v):
    return v is not NIL and v[0] in ("int", "float", "dur")


def compare(op, a, b):
    if b is NIL:
        if a is NIL:
            return op in ("=", "<=", ">=")
        return op == "!="
    if a is NIL:
        return False
    if numeric(a) and numeric(b):
        x, y = a[1], b[1]
    elif a[0] == b[0] == "str":
        x, y = a[1], b[1]
    elif a[0] == b[0] and a[0] in ("bool", "status", "kind"):
        return {"=": a[1] == b[1], "!=": a[1] != b[1]}.get(op, False)
    else:
        return False
    return {"=": x == y, "!=": x != y, "<": x < y, "<=": x <= y, ">": x > y, ">=": x >= y}[op]


class TraceQL:
    def __init__(self, q):
        self.q = q
        self.ast = Parser(q).query()

    # -- values -------------------------------------------------------------
    @staticmethod
    def attr(a, t, s):
        scope, name = a
        if scope == "intrinsic":
            return {
                "name": lambda: ("str", s.name),
                "status": lambda: ("status", STATUSES[s.code]),
                "statusMessage": lambda: ("str", s.msg),
                "duration": lambda: ("dur", s.end - s.start),
                "kind": lambda: ("kind", KINDS[s.kind]),
                "traceDuration": lambda: ("dur", t.end - t.start),
                "rootName": lambda: ("str", t.root.name),
                "rootServiceName": lambda: ("str", t.root.service),
            }[name]()
        if scope == "span":
            return s.attrs.get(name, NIL)
        if scope == "resource":
            return s.resource().get(name, NIL)
        return s.attrs.get(name, s.resource().get(name, NIL))

    def value(self, f, t, s):
        kind = f[0]
        if kind == "lit":
            return f[1]
        if kind == "attr":
            return self.attr(f[1], t, s)
        if kind == "not":
            v = self.value(f[1], t, s)
            return ("bool", not v[1]) if v is not NIL and v[0] == "bool" else NIL
        if kind == "and":
            return ("bool", self.value(f[1], t, s) == TRUE and self.value(f[2], t, s) == TRUE)
        if kind == "or":
            return ("bool", self.value(f[1], t, s) == TRUE or self.value(f[2], t, s) == TRUE)
        _, op, lhs, rhs = f
        a, b = self.value(lhs, t, s), self.value(rhs, t, s)
        if op in ("=~", "!~"):
            if a is NIL or a[0] != "str":
                return ("bool", False)
            return ("bool", (re.fullmatch(b[1], a[1]) is not None) == (op == "=~"))
        return ("bool", compare(op, a, b))

    # -- span sets ----------------------------------------------------------
    def spansets(self, e, t, sets):
        kind = e[0]
        if kind == "filter":
            out = [[sid for sid in st if self.value(e[1], t, t.by_id[sid]) == TRUE] for st in sets]
            return [st for st in out if st]
        if kind in ("and", "or"):
            left, right = self.spansets(e[1], t, sets), self.spansets(e[2], t, sets)
            if (kind == "and" and (not left or not right)) or (kind == "or" and not left and not right):
                return []
            return [sorted({sid for st in left + right for sid in st})]
        if kind == "struct":
            op = e[1]
            left = {sid for st in self.spansets(e[2], t, sets) for sid in st}
            right = sorted({sid for st in self.spansets(e[3], t, sets) for sid in st})
            base = op.lstrip("!")

            def related(j):
                if base == ">":
                    return t.parent[j] in left
                if base == "<":
                    return any(c in left for c in t.children[j])
                if base == ">>":
                    return any(a in left for a in t.ancestors(j))
                if base == "<<":
                    return any(j in set(t.ancestors(i)) for i in left)
                p = t.parent[j]
                return p is not None and any(i != j and t.parent[i] == p for i in left)

            out = [j for j in right if related(j) != op.startswith("!")]
            return [out] if out else []
        # pipeline
        sets = self.spansets(e[1], t, sets)
        for stage in e[2]:
            if not sets:
                break
            sets = self.stage(stage, t, sets)
        return sets

    def stage(self, st, t, sets):
        kind = st[0]
        if kind == "stagefilter":
            return [out for s in sets for out in self.spansets(st[1], t, [s])]
        if kind == "select":
            return sets
        if kind == "coalesce":
            return [sorted({sid for s in sets for sid in s})]
        if kind == "by":
            groups = {}
            for s in sets:
                for sid in s:
                    groups.setdefault(self.value(st[1], t, t.by_id[sid]), []).append(sid)
            return list(groups.values())
        _, fn, arg, op, lit = st
        keep = []
        for s in sets:
            if fn == "count":
                agg = float(len(s))
            else:
                vals = [v[1] for v in (self.value(arg, t, t.by_id[sid]) for sid in s) if numeric(v)]
                if fn == "sum":
                    agg = float(sum(vals))
                elif not vals:
                    continue
                else:
                    agg = {"avg": lambda: sum(vals) / len(vals), "min": lambda: min(vals),
                           "max": lambda: max(vals)}[fn]()
            if compare(op, ("float", agg), lit):
                keep.append(s)
        return keep

    # -- the names the answer carries -----------------------------------------
    def named(self):
        out = []

        def field(f):
            if f[0] == "attr" and f[1] not in out:
                out.append(f[1])
            elif f[0] == "not":
                field(f[1])
            elif f[0] in ("and", "or"):
                field(f[1])
                field(f[2])
            elif f[0] == "cmp":
                field(f[2])
                field(f[3])

        def spansets(e):
            if e[0] == "filter":
                field(e[1])
            elif e[0] in ("and", "or"):
                spansets(e[1])
                spansets(e[2])
            elif e[0] == "struct":
                spansets(e[2])
                spansets(e[3])
            elif e[0] == "pipe":
                spansets(e[1])
                for st in e[2]:
                    if st[0] == "stagefilter":
                        spansets(st[1])
                    elif st[0] == "by":
                        field(st[1])
                    elif st[0] == "select":
                        for a in st[1]:
                            if a not in out:
                                out.append(a)

        spansets(self.ast)
        return out

    # -- the answer -----------------------------------------------------------
    def search(self, traces, start_s, end_s, limit=20, spss=3):
        """Tempo's answer for the traces with a span starting in
        [start_s, end_s + 1 s), newest first, at most `limit`."""
        lo, hi = start_s * SEC, (end_s + 1) * SEC
        named = [a for a in self.named() if a not in TRACE_LEVEL]
        found = []
        for spans in traces:
            in_window = [s.start for s in spans if lo <= s.start < hi]
            if not in_window:
                continue
            t = TraceView(spans)
            sets = self.spansets(self.ast, t, [[s.id for s in spans]])
            if sets:
                found.append((max(in_window), t, sets))
        found.sort(key=lambda x: -x[0])
        return [self.trace_json(t, sets, named, spss) for _, t, sets in found[:limit]]

    def trace_json(self, t, sets, named, spss):
        def span_json(s):
            attrs = []
            for a in named:
                if a in (("intrinsic", "name"), ("intrinsic", "duration")):
                    continue
                v = self.attr(a, t, s)
                if v is not NIL:
                    attrs.append({"key": a[1], "value": otlp_json(v)})
            return {"spanID": s.id.hex(), "name": s.name, "startTimeUnixNano": str(s.start),
                    "durationNanos": str(s.end - s.start), "attributes": attrs}

        span_sets = []
        for st in sets:
            ordered = sorted((t.by_id[sid] for sid in st), key=lambda s: -s.start)
            span_sets.append({"spans": [span_json(s) for s in ordered[:spss]], "matched": len(st)})
        return {"traceID": t.spans[0].trace.hex().lstrip("0") or "0", "rootServiceName": t.root.service,
                "rootTraceName": t.root.name, "startTimeUnixNano": str(t.start),
                "durationMs": (t.end - t.start) // MS, "spanSets": span_sets}


# Span-set attributes of trace-level intrinsics are not specified by the
# brief (Tempo leaves them out; Mira may repeat them per span): not compared.
TRACE_LEVEL = [("intrinsic", "traceDuration"), ("intrinsic", "rootName"), ("intrinsic", "rootServiceName")]
TRACE_LEVEL_KEYS = {a[1] for a in TRACE_LEVEL}


def otlp_json(v):
    t, x = v
    if t == "str":
        return {"stringValue": x}
    if t == "int":
        return {"intValue": str(x)}
    if t == "float":
        return {"doubleValue": x}
    if t == "bool":
        return {"boolValue": x}
    if t in ("status", "kind"):
        return {"stringValue": x}
    raise ValueError(v)


# ---------------------------------------------------------------------------
# Asking Mira, and comparing
# ---------------------------------------------------------------------------

def search(serve, q, tenant=None, **params):
    """(status, body: parsed JSON or text) of GET /api/search."""
    p = {"q": q} if q is not None else {}
    p.update({k: v for k, v in params.items() if v is not None})
    url = f"http://{serve.query}/api/search?{urllib.parse.urlencode(p, quote_via=urllib.parse.quote)}"
    headers = {"Accept": "application/json"}
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as r:
            raw = r.read()
            return r.status, json.loads(raw)
    except urllib.error.HTTPError as e:
        raw = e.read().decode("utf-8", "replace")
        try:
            return e.code, json.loads(raw)
        except ValueError:
            return e.code, raw


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def is_digits(x):
    return isinstance(x, str) and re.fullmatch(r"0|[1-9][0-9]*", x) is not None


def check_types(body):
    """Grafana's Go decoder (search.go) is strict: B3's exact JSON types."""
    assert isinstance(body, dict) and isinstance(body.get("traces"), list), body
    for tr in body["traces"]:
        assert isinstance(tr["traceID"], str) and re.fullmatch(r"[1-9a-f][0-9a-f]{0,31}", tr["traceID"]), tr
        assert isinstance(tr["rootServiceName"], str) and isinstance(tr["rootTraceName"], str), tr
        assert is_digits(tr["startTimeUnixNano"]), tr
        assert is_int(tr["durationMs"]) and 0 <= tr["durationMs"] < 2 ** 32, tr
        assert isinstance(tr["spanSets"], list) and tr["spanSets"], tr
        assert tr.get("spanSet") == tr["spanSets"][0], "spanSet is the first of spanSets"
        for st in tr["spanSets"]:
            assert is_int(st["matched"]) and st["matched"] >= len(st["spans"]) >= 1, st
            for sp in st["spans"]:
                assert isinstance(sp["spanID"], str) and re.fullmatch(r"[0-9a-f]{16}", sp["spanID"]), sp
                assert isinstance(sp["name"], str), sp
                assert is_digits(sp["startTimeUnixNano"]) and is_digits(sp["durationNanos"]), sp
                assert isinstance(sp["attributes"], list), sp
                for kv in sp["attributes"]:
                    assert isinstance(kv["key"], str) and len(kv["value"]) == 1, kv
                    (vt, vv), = kv["value"].items()
                    assert vt in ("stringValue", "intValue", "doubleValue", "boolValue"), kv
                    if vt == "stringValue":
                        assert isinstance(vv, str), kv
                    elif vt == "intValue":
                        assert isinstance(vv, str) and re.fullmatch(r"-?[0-9]+", vv), kv
                    elif vt == "doubleValue":
                        assert isinstance(vv, (int, float)) and not isinstance(vv, bool), kv
                    else:
                        assert isinstance(vv, bool), kv


def normal_span(sp):
    attrs = sorted((kv["key"], json.dumps(kv["value"], sort_keys=True)) for kv in sp["attributes"]
                   if kv["key"] not in TRACE_LEVEL_KEYS)
    return {"spanID": sp["spanID"], "name": sp["name"], "startTimeUnixNano": sp["startTimeUnixNano"],
            "durationNanos": sp["durationNanos"], "attributes": attrs}


def normal(traces):
    """The compared part of an answer: traces in order; each trace's span
    sets in any order (their order is not specified), each set's spans in
    order (newest first), each span's attributes in any order."""
    out = []
    for tr in traces:
        sets = [{"matched": st["matched"], "spans": [normal_span(sp) for sp in st["spans"]]} for st in tr["spanSets"]]
        sets.sort(key=lambda st: json.dumps(st, sort_keys=True))
        out.append({k: tr[k] for k in ("traceID", "rootServiceName", "rootTraceName", "startTimeUnixNano",
                                        "durationMs")} | {"spanSets": sets})
    return out


def assert_same(got, want, q):
    g, w = normal(got), normal(want)
    if g == w:
        return
    gi, wi = [t["traceID"] for t in g], [t["traceID"] for t in w]
    if gi != wi:
        raise AssertionError(f"{q}: trace ids\n  got  {gi}\n  want {wi}")
    for a, b in zip(g, w):
        if a != b:
            raise AssertionError(f"{q}: trace {a['traceID']}\n  got  {json.dumps(a)}\n  want {json.dumps(b)}")
    raise AssertionError(q)


# ---------------------------------------------------------------------------
# Fixtures
# ---------------------------------------------------------------------------

class World:
    def __init__(self, serve, base):
        self.serve, self.base = serve, base
        self.traces = build_dataset(base)
        self.tenant_a = small_traces(base, 7, ["checkout"], 3, "tenant-a-op")
        self.tenant_b = small_traces(base, 8, ["inventory"], 1, "tenant-b-op")
        self.prune = small_traces(base, 9, ["alpha", "beta", "gamma"], 4, "op")

    def window(self):
        return self.base // SEC - 5, int(time.time()) + 1

    def ask(self, q, tenant=None, data=None, limit=20, spss=3, window=None, reference=True):
        """Mira's answer and the expected one."""
        start, end = window or self.window()
        status, body = search(self.serve, q, tenant=tenant, limit=limit, spss=spss, start=start, end=end)
        assert status == 200, (q, status, body)
        check_types(body)
        if not reference:
            return body, None
        want = TraceQL(q).search(self.traces if data is None else data, start, end, limit, spss)
        return body, want


def base_time():
    # 25 minutes ago on a whole second: the ingester takes the last 7 days.
    return (time.time_ns() - 25 * 60 * SEC) // SEC * SEC


@pytest.fixture(scope="module")
def sealed():
    s = Serve("--seal-age", "1s")
    try:
        w = World(s, base_time())
        send(s, w.traces[:20])
        send(s, w.traces[20:])
        send(s, w.tenant_a, tenant="a")
        send(s, w.tenant_b, tenant="b")
        wait_sealed(s, w.traces)
        # The pruning tenant: one service per batch, each batch sealed
        # before the next, so each block holds one service.
        for k in range(3):
            send(s, w.prune[4 * k:4 * k + 4], tenant="prune")
            wait_sealed(s, w.prune[:4 * k + 4], tenant="prune")
        wait_sealed(s, w.tenant_a, tenant="a")
        yield w
    finally:
        s.kill()


@pytest.fixture(scope="module")
def fresh():
    s = Serve()
    try:
        w = World(s, base_time())
        send(s, w.traces)
        send(s, w.tenant_a, tenant="a")
        send(s, w.tenant_b, tenant="b")
        yield w
    finally:
        s.kill()


# ---------------------------------------------------------------------------
# The searches
# ---------------------------------------------------------------------------

# (query, minimum and maximum number of matching traces before `limit`,
# extra params). The bounds keep the dataset honest: each query must
# separate traces.
CASES = [
    # Grafana's builder (B6): default shape and its pieces.
    ('{resource.service.name="checkout" && name="POST /pay" && status=error && duration>100ms && '
     'span.http.status_code=500}', 1, 39, {}),
    ('{resource.service.name="payments"}', 2, 39, {}),
    ('{(resource.service.name="payments" || resource.service.name="inventory")}', 2, 39, {}),
    ('{(resource.service.name="payments" || resource.service.name="inventory") && kind=server && status=error}',
     1, 39, {}),
    ('{resource.service.name=~"pay.*|inv.*" && kind=consumer}', 1, 39, {}),
    ('{name=~"GET"}', 0, 0, {}),  # anchored: no span is named exactly GET
    ('{name=~"GET /.*"}', 1, 39, {}),
    (r'{name=~"db\\.query|render"}', 1, 39, {}),  # escaped metacharacter: not dbXquery
    ('{name!~".*/.*" && kind=server}', 1, 39, {}),
    ('{resource.deployment.environment="staging" && duration<5ms}', 1, 39, {}),
    # Unscoped: the span's attribute, else the resource's.
    ('{.region="eu-west"}', 1, 39, {}),
    ('{.region="ap-south"}', 1, 1, {}),
    ('{.region="us-east" && .http.method="POST"}', 1, 39, {}),
    ('{.deployment.environment="prod" && kind=producer}', 1, 39, {}),
    # Intrinsics, bare and colon forms.
    ('{name="charge"}', 1, 39, {}),
    ('{status=error}', 2, 39, {}),
    ('{status=ok && resource.service.name="inventory"}', 1, 39, {}),
    ('{status=unset && kind=client}', 1, 39, {}),
    ('{statusMessage="card declined"}', 1, 39, {}),
    ('{statusMessage=~".*timeout.*|late"}', 1, 39, {}),
    ('{status=ok && statusMessage="fine"}', 1, 39, {}),
    ('{duration>1s}', 1, 39, {}),
    ('{duration>=100ms && duration<=500ms && kind=internal}', 1, 39, {}),
    ('{span:duration > 1.5s}', 1, 39, {}),
    ('{kind=server && status=error}', 1, 39, {}),
    ('{kind=client && span.retry=true}', 1, 39, {}),
    ('{kind=internal && span.cache.hit=false}', 1, 39, {}),
    ('{kind=producer}', 1, 39, {}),
    ('{kind=consumer}', 1, 39, {}),
    ('{kind=unspecified}', 1, 39, {}),
    ('{traceDuration>2s}', 1, 39, {}),
    ('{trace:duration < 100ms}', 1, 39, {}),
    ('{rootName="POST /pay"}', 1, 39, {}),
    ('{rootName="orphan-early"}', 1, 1, {}),  # no parentless span: the earliest is the root
    ('{rootName="first-root" && name="fraud-check"}', 1, 1, {}),  # the earlier parentless span
    ('{rootServiceName="inventory" && resource.service.name="payments"}', 1, 39, {}),
    ('{trace:rootService="payments" && span:kind=server && span:status=ok}', 1, 39, {}),
    ('{span:name="zero-id-span"}', 1, 1, {}),  # trace id with leading zeros, span id too
    # nil, typed comparisons.
    ('{span.retry != nil && resource.service.name="checkout"}', 1, 39, {}),
    ('{span.http.status_code = nil && kind=server}', 1, 39, {}),
    ('{span.http.status_code != 200}', 1, 39, {}),  # needs the attribute
    ('{span.http.status_code = "500"}', 1, 1, {}),  # only the string one
    ('{span.http.status_code = 500 && status=error}', 1, 39, {}),
    ('{span.http.status_code >= 400 && span.http.status_code < 500}', 1, 39, {}),
    ('{resource.host.cpus = "4"}', 0, 0, {}),  # an int is not a string
    ('{resource.host.cpus > 3 && resource.host.cpus <= 8.0 && kind=consumer}', 1, 39, {}),
    ('{span.cache.hit = "true"}', 1, 1, {}),  # only the string one, not the bools
    ('{span.retry = 1}', 0, 0, {}),  # a bool is not a number
    ('{span.amount = 100}', 2, 39, {}),  # the int 100 and the float 100.0
    ('{span.amount > 10 && span.amount < 50.5}', 1, 39, {}),
    ('{span.db.rows > 250 || span.db.rows = 0}', 1, 39, {}),
    ('{!(span.http.status_code = 200) && kind=server}', 1, 39, {}),
    ('{name="late-child" || name="second-root"}', 2, 2, {}),
    # Span set operators.
    ('{resource.service.name="payments" && status=error} && {resource.service.name="inventory"}', 1, 39, {}),
    ('{name="refund"} || {name="GET /stock"}', 2, 39, {}),
    ('{kind=producer} && {kind=consumer && status=unset}', 1, 39, {}),
    # Structural.
    ('{kind=server} > {kind=client}', 1, 39, {}),
    ('{resource.service.name="checkout"} >> {resource.service.name="inventory"}', 1, 39, {}),
    ('{name="db.query"} < {}', 1, 39, {}),
    ('{status=error} << {kind=server}', 1, 39, {}),
    ('{kind=client} ~ {kind=internal}', 1, 39, {}),
    ('{kind=server} !> {kind=internal}', 1, 39, {}),
    ('{} !< {kind=server}', 1, 39, {}),  # servers with no children
    ('({kind=client} > {kind=server}) > {}', 1, 39, {}),
    # Pipelines.
    ('{} | count() > 6', 1, 39, {}),
    ('{resource.service.name="payments"} | count() >= 3', 1, 39, {}),
    ('{kind=server} | avg(duration) > 500ms', 1, 39, {}),
    ('{} | max(duration) < 300ms', 1, 39, {}),
    ('{} | min(duration) > 10ms', 1, 39, {}),
    ('{} | sum(duration) > 5s', 1, 39, {}),
    ('{span.amount != nil} | avg(span.amount) > 40', 1, 39, {}),
    ('{kind=server} | {status=error}', 1, 39, {}),
    ('{status=error} | select(span.http.status_code, resource.deployment.environment, statusMessage, kind)',
     2, 39, {}),
    ('{name="charge"} | select(span.amount, span.retry, resource.host.cpus, .region)', 1, 39, {}),
    ('{} | by(resource.service.name)', 40, 40, {"spss": 2, "limit": 100}),
    ('{status=error} | by(kind) | count() > 1', 1, 39, {}),
    ('{} | by(resource.service.name) | coalesce()', 40, 40, {"spss": 4, "limit": 100}),
    # Limits.
    ('{}', 40, 40, {"limit": 5}),
    ('{}', 40, 40, {"limit": 100, "spss": 1}),
    ('{kind=server}', 40, 40, {"limit": 3, "spss": 10}),
    ('{resource.service.name="checkout"}', 8, 39, {"limit": 7, "spss": 1}),
]


def case_id(c):
    q, _, _, extra = c
    return q + ("" if not extra else " " + " ".join(f"{k}={v}" for k, v in sorted(extra.items())))


@pytest.mark.parametrize("case", CASES, ids=[case_id(c) for c in CASES])
def test_search_matches_the_reference(sealed, case):
    q, lo, hi, extra = case
    body, want = sealed.ask(q, **extra)
    every = TraceQL(q).search(sealed.traces, *sealed.window(), limit=1000)
    assert lo <= len(every) <= hi, f"the dataset no longer exercises {q!r}: {len(every)} traces match"
    assert_same(body["traces"], want, q)
    if not want:
        assert body["traces"] == []
    # Everything of this tenant is in published blocks.
    assert body["stats"]["recent_blocks"] == 0, body["stats"]


# A sample of the cases, answered from open (unsealed) blocks.
FRESH_CASES = [c for c in CASES if c[0] in (
    '{resource.service.name="checkout" && name="POST /pay" && status=error && duration>100ms && '
    'span.http.status_code=500}',
    '{.region="eu-west"}', '{span.http.status_code = "500"}', '{kind=server} > {kind=client}',
    '{} | count() > 6', '{} | by(resource.service.name)', '{rootName="orphan-early"}',
    '{name="refund"} || {name="GET /stock"}')] + [('{}', 40, 40, {"limit": 100, "spss": 1})]


@pytest.mark.parametrize("case", FRESH_CASES, ids=[case_id(c) for c in FRESH_CASES])
def test_search_of_open_blocks_matches_the_reference(fresh, case):
    q, lo, hi, extra = case
    body, want = fresh.ask(q, **extra)
    assert_same(body["traces"], want, q)
    assert body["stats"]["recent_blocks"] > 0, body["stats"]


def test_a_search_reading_many_open_traces_at_once_is_complete(fresh):
    """`limit=40` reads up to 40 whole traces at once, each from the
    ingester's open blocks (which answers 8 recent-data requests at a
    time). Every trace must be there, every time."""
    for attempt in range(3):
        body, want = fresh.ask("{}", limit=40, spss=1)
        assert len(want) == 40
        assert_same(body["traces"], want, f"{{}} limit=40, attempt {attempt + 1}")


def test_defaults_are_limit_20_and_3_spans_per_set(sealed):
    start, end = sealed.window()
    status, body = search(sealed.serve, "{}", start=start, end=end)
    assert status == 200, body
    check_types(body)
    assert_same(body["traces"], TraceQL("{}").search(sealed.traces, start, end, 20, 3), "{} (defaults)")
    assert len(body["traces"]) == 20


def test_the_json_types_grafana_decodes(sealed):
    """B3 literally, on a query whose spans carry attributes of every type."""
    q = '{} | select(span.http.status_code, span.amount, span.retry, span.http.method, status)'
    body, want = sealed.ask(q, limit=100, spss=5)
    assert_same(body["traces"], want, q)
    seen = set()
    for tr in body["traces"]:
        assert type(tr["startTimeUnixNano"]) is str and type(tr["durationMs"]) is int
        for st in tr["spanSets"]:
            assert type(st["matched"]) is int
            for sp in st["spans"]:
                assert type(sp["startTimeUnixNano"]) is str and type(sp["durationNanos"]) is str
                for kv in sp["attributes"]:
                    (vt, vv), = kv["value"].items()
                    seen.add((kv["key"], vt, type(vv).__name__))
    assert ("http.status_code", "intValue", "str") in seen, seen
    assert ("amount", "doubleValue", "float") in seen, seen
    assert ("retry", "boolValue", "bool") in seen, seen
    assert ("http.method", "stringValue", "str") in seen, seen
    assert ("status", "stringValue", "str") in seen, seen
    # Hex without leading zeros, and the span id of 16 digits with its zeros.
    zeros = next(t for t in sealed.traces if t[1].name == "zero-id-span")
    body, _ = sealed.ask('{name="zero-id-span"}')
    (tr,) = body["traces"]
    assert tr["traceID"] == zeros[0].trace.hex().lstrip("0") and len(tr["traceID"]) < 32
    assert tr["spanSets"][0]["spans"][0]["spanID"] == "0000000000001234"


def test_spss_1_returns_the_newest_span_and_counts_all(sealed):
    q = "{}"
    body, want = sealed.ask(q, limit=100, spss=1)
    assert_same(body["traces"], want, q)
    for tr, spans in ((tr, next(t for t in sealed.traces if t[0].trace.hex().lstrip("0") == tr["traceID"]))
                      for tr in body["traces"]):
        (st,) = tr["spanSets"]
        assert st["matched"] == len(spans)
        assert st["spans"][0]["spanID"] == max(spans, key=lambda s: s.start).id.hex()


@pytest.mark.parametrize("q", ['{} | count() = 4', '{kind=client} > {resource.service.name="inventory"}',
                               '{name="late-child"}', '{name="late-child" && status=error}'])
def test_a_trace_is_read_whole_when_part_of_it_is_in_the_window(sealed, q):
    """Only the root of the `window` trace (and a child 5 ms later) start
    inside [start, end] (one second); its other spans start 1.5 s later and
    still count, for conditions and counts alike, as in Tempo, which
    searches the traces overlapping the window."""
    w = next(t for t in sealed.traces if any(s.name == "late-child" for s in t))
    second = w[0].start // SEC
    body, want = sealed.ask(q, window=(second, second))
    assert [t["traceID"] for t in want] == [w[0].trace.hex().lstrip("0")], q
    assert_same(body["traces"], want, q)
    # A window with none of its spans finds nothing.
    body, want = sealed.ask(q, window=(second - 10, second - 10))
    assert want == [] and body["traces"] == []


def test_a_catastrophic_regex_is_answered(sealed):
    """RE2 has no backtracking: `(a|aa)+b` against 40 a's and a '!' is
    answered at once (a backtracking engine takes ~2^40 steps)."""
    # (Python's own regex engine backtracks: no reference evaluation here.)
    body, _ = sealed.ask('{span.payload =~ "(a|aa)+b"}', reference=False)
    assert body["traces"] == []
    payload = next(t for t in sealed.traces if any("payload" in s.attrs for s in t))
    body, _ = sealed.ask('{span.payload =~ "(a|aa)+!"}', reference=False)
    assert [t["traceID"] for t in body["traces"]] == [payload[0].trace.hex().lstrip("0")]


# ---------------------------------------------------------------------------
# Tenants
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["sealed", "fresh"])
def test_tenants_see_only_their_traces(request, where):
    w = request.getfixturevalue(where)
    body, want = w.ask('{name="tenant-a-op"}', tenant="a", data=w.tenant_a)
    assert len(want) == 3
    assert_same(body["traces"], want, "tenant a")
    body, want = w.ask("{}", tenant="a", data=w.tenant_a, limit=100)
    assert_same(body["traces"], want, "tenant a {}")
    # Tenant b has data of its own, and none of a's.
    body, _ = w.ask('{name="tenant-a-op"}', tenant="b")
    assert body["traces"] == []
    body, want = w.ask("{}", tenant="b", data=w.tenant_b, limit=100)
    assert len(want) == 1
    assert_same(body["traces"], want, "tenant b {}")
    # The default tenant sees neither.
    body, _ = w.ask('{name="tenant-a-op" || name="tenant-b-op"}')
    assert body["traces"] == []
    # A tenant without data: 200 and no traces.
    start, end = w.window()
    status, body = search(w.serve, "{}", tenant="nobody", start=start, end=end)
    assert status == 200 and body["traces"] == [], body


# ---------------------------------------------------------------------------
# Pruning
# ---------------------------------------------------------------------------

def test_a_service_search_prunes_blocks(sealed):
    """Three sealed batches of one service each: `{resource.service.name=x}`
    fetches fewer blocks than `{}` and says what pruned them."""
    w = sealed
    q = '{resource.service.name="beta"}'
    body, want = w.ask(q, tenant="prune", data=w.prune, limit=100)
    assert len(want) == 4
    assert_same(body["traces"], want, q)
    everything, want_all = w.ask("{}", tenant="prune", data=w.prune, limit=100)
    assert len(want_all) == 12
    assert_same(everything["traces"], want_all, "{}")
    one, alls = body["stats"], everything["stats"]
    assert one["recent_blocks"] == 0 and alls["recent_blocks"] == 0, (one, alls)
    assert alls["blocks_considered"] >= 3 and alls["blocks_fetched"] >= 3, alls
    assert one["blocks_pruned"]["attr_index"] + one["blocks_pruned"]["zone_map"] >= 1, one
    assert one["blocks_fetched"] < alls["blocks_fetched"], (one, alls)


# ---------------------------------------------------------------------------
# Errors and hostile input
# ---------------------------------------------------------------------------

def echo(serve):
    with urllib.request.urlopen(f"http://{serve.query}/api/echo", timeout=10) as r:
        return r.status, r.read()


POSITION = re.compile(r"(col(umn)?|pos(ition)?|offset|char(acter)?)\W*\d+", re.I)


@pytest.mark.parametrize("q", ['{ name = "x"', '{ name = "x" }}', "{ resource.service.name = }", "{ status = }",
                               '{ name = "x" } | count( > 2', '{ name = "unterminated }'])
def test_a_parse_error_is_400_naming_the_position(fresh, q):
    start, end = fresh.window()
    status, body = search(fresh.serve, q, start=start, end=end)
    assert status == 400, (q, status, body)
    assert isinstance(body, str) and POSITION.search(body), (q, body)
    assert echo(fresh.serve) == (200, b"echo")


def test_a_metrics_query_is_400_not_supported(fresh):
    start, end = fresh.window()
    status, body = search(fresh.serve, "{} | rate()", start=start, end=end)
    assert status == 400 and "not supported" in str(body), (status, body)


def test_deep_nesting_is_refused_and_the_querier_survives(fresh):
    start, end = fresh.window()
    q = "{" + "(" * 10_000 + 'name="x"' + ")" * 10_000 + "}"
    url = (f"http://{fresh.serve.query}/api/search?"
           f"{urllib.parse.urlencode({'q': q, 'start': start, 'end': end}, quote_via=urllib.parse.quote, safe='()')}")
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            status, body = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, body = e.code, e.read().decode("utf-8", "replace")
    assert 400 <= status < 500, (status, body[:300])
    assert re.search(r"nest|deep|depth|too long|too large", body, re.I), body[:300]
    assert echo(fresh.serve) == (200, b"echo")


@pytest.mark.parametrize("shape", ["or-chain", "structural-chain", "pipeline-chain"])
def test_long_chains_do_not_crash_the_querier(fresh, shape):
    """2,000 operators in a row (far deeper than any real query; the URL
    stays under 64 KiB): answered correctly or refused with a 4xx, never a
    crash. The reference evaluates the equivalent short query."""
    n = 2_000
    q, same_as = {"or-chain": ("{" + "||".join(["status!=ok"] * n) + "}", "{status!=ok}"),
                  "structural-chain": (">".join(["{}"] * n), None),
                  "pipeline-chain": ("{}" + "|{}" * n, "{}")}[shape]
    start, end = fresh.window()
    status, body = search(fresh.serve, q, start=start, end=end, limit=5)
    assert status == 200 or 400 <= status < 500, (status, str(body)[:300])
    if status == 200:
        check_types(body)
        # No trace is 2,000 spans deep.
        want = [] if same_as is None else TraceQL(same_as).search(fresh.traces, start, end, 5, 3)
        assert [t["traceID"] for t in body["traces"]] == [t["traceID"] for t in want]
    else:
        assert isinstance(body, str) and body.strip(), body
    assert echo(fresh.serve) == (200, b"echo")


def test_a_regex_too_big_to_compile_is_400_naming_the_regex(fresh):
    start, end = fresh.window()
    status, body = search(fresh.serve, '{name =~ "(a{1000}){1000}"}', start=start, end=end)
    assert status == 400 and "regex" in str(body).lower(), (status, str(body)[:300])
    assert echo(fresh.serve) == (200, b"echo")


@pytest.mark.parametrize("params,words", [
    ({"limit": 99999999}, ["limit"]),
    ({"limit": "many"}, ["limit"]),
    ({"spss": "-1"}, ["spss"]),
    ({"start": 2_000_000_000, "end": 1_000_000_000}, ["start", "end"]),
    ({"start": "yesterday"}, ["start"]),
])
def test_bad_parameters_are_4xx_naming_the_problem(fresh, params, words):
    p = {"start": fresh.window()[0], "end": fresh.window()[1]}
    p.update(params)
    status, body = search(fresh.serve, "{}", **p)
    assert 400 <= status < 500, (params, status, body)
    text = str(body).lower()
    assert all(wd in text for wd in words), (params, body)
    assert echo(fresh.serve) == (200, b"echo")
