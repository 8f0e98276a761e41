"""Loki's HTTP API (`/loki/api/v1/*`) as Grafana's Loki data source calls it
(docs: design/grafana-api.md §A), against `mira serve` fed OTLP log records
with exact timestamps, severities, bodies, attributes and trace ids.

Every answer that depends on the data is compared with what a small LogQL
evaluator written in this file computes from the records the test sent. The
evaluator follows the label model of the Loki API (stream labels, structured
metadata, parsed labels, `detected_level`) and Loki's range semantics; it does
not call Mira. Covered: Grafana's health check, the log-volume query, log and
metric queries (121, each its own test id), labels, values and
series, tenants, the categorize-labels shape, bloom pruning stats of
trace-to-logs, live tail over a WebSocket, hostile input, and the metadata
endpoints."""

import json
import math
import random
import re
import select
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import (ExportLogsServiceRequest,
                                                                    ExportLogsServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue, KeyValueList
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from serve_proc import Serve, wait_until

S = 1_000_000_000
MS = 1_000_000
MIN = 60 * S

# ----------------------------------------------------------------------------------------------
# The label model (design/grafana-api.md A6; the Loki API's documented model)

INDEX = [
    ("service_name", "service.name"), ("service_namespace", "service.namespace"),
    ("service_instance_id", "service.instance.id"), ("deployment_environment", "deployment.environment"),
    ("deployment_environment_name", "deployment.environment.name"), ("cloud_region", "cloud.region"),
    ("cloud_availability_zone", "cloud.availability_zone"), ("container_name", "container.name"),
    ("k8s_cluster_name", "k8s.cluster.name"), ("k8s_namespace_name", "k8s.namespace.name"),
    ("k8s_pod_name", "k8s.pod.name"), ("k8s_container_name", "k8s.container.name"),
    ("k8s_deployment_name", "k8s.deployment.name"), ("k8s_statefulset_name", "k8s.statefulset.name"),
    ("k8s_daemonset_name", "k8s.daemonset.name"), ("k8s_replicaset_name", "k8s.replicaset.name"),
    ("k8s_job_name", "k8s.job.name"), ("k8s_cronjob_name", "k8s.cronjob.name"),
]
INDEX_KEYS = {k for _, k in INDEX}
STREAM, META, PARSED = "stream", "meta", "parsed"
ERROR = "__error__"


def label_name(key):
    out = "".join(c if (c.isascii() and c.isalnum()) or c == "_" else "_" for c in key)
    if not out or out[0].isdigit():
        out = "_" + out
    return out


def rust_f64(x):
    """Rust's `Display` for a finite f64 (no exponent, no trailing `.0`)."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    r = repr(x)
    assert "e" not in r, r
    return r


def text_of(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return rust_f64(v)
    if isinstance(v, str):
        return v
    if isinstance(v, dict):
        return None
    raise TypeError(v)


LEVEL_WORDS = {
    "trace": "trace", "trc": "trace",
    "debug": "debug", "dbug": "debug", "dbg": "debug",
    "info": "info", "inf": "info", "information": "info", "informational": "info", "notice": "info",
    "warn": "warn", "wrn": "warn", "warning": "warn",
    "error": "error", "err": "error", "eror": "error",
    "fatal": "fatal", "critical": "fatal", "crit": "fatal", "emerg": "fatal", "emergency": "fatal",
    "alert": "fatal", "panic": "fatal",
}


def detected_level(text, number):
    word = LEVEL_WORDS.get(text.strip().lower())
    if word:
        return word
    for hi, name in ((4, "trace"), (8, "debug"), (12, "info"), (16, "warn"), (20, "error"), (24, "fatal")):
        if 1 <= number <= hi:
            return name
    return "unknown"


class Entry:
    """A log entry: ts, line and ordered labels [name, value, kind]."""

    def __init__(self, ts, line, is_text):
        self.ts, self.line, self.is_text, self.labels = ts, line, is_text, []

    def get(self, name):
        for n, v, _ in self.labels:
            if n == name:
                return v
        return None

    def kind(self, name):
        for n, _, k in self.labels:
            if n == name:
                return k
        return None

    def add(self, name, value, kind):
        """First wins."""
        if self.get(name) is None:
            self.labels.append([name, value, kind])

    def set(self, name, value, kind):
        """Replaces the value (keeping the kind) or adds."""
        for lab in self.labels:
            if lab[0] == name:
                lab[1] = value
                return
        self.labels.append([name, value, kind])

    def remove(self, name):
        self.labels = [lab for lab in self.labels if lab[0] != name]

    def all(self):
        return {n: v for n, v, _ in self.labels}

    def of(self, kind):
        return {n: v for n, v, k in self.labels if k == kind}

    def filter_text(self):
        return self.line if self.is_text else ""


@dataclass
class Rec:
    ts: int
    resource: list
    scope: tuple  # (name, version, [(k, v)])
    attrs: list
    body: object
    sev_text: str = ""
    sev_num: int = 0
    trace_id: bytes = b""
    span_id: bytes = b""
    flags: int = 0
    observed: int = 0


def add_attr(e, prefix, v, kind):
    t = text_of(v)
    if t is not None:
        e.add(label_name(prefix), t, kind)
    else:
        for k, inner in v.items():
            add_attr(e, f"{prefix}_{k}", inner, kind)


def model_entry(r):
    if isinstance(r.body, str):
        line, is_text = r.body, True
    elif r.body is None:
        line, is_text = "", True
    else:
        line, is_text = json.dumps(r.body, separators=(",", ":"), sort_keys=True), False
    e = Entry(r.ts, line, is_text)
    res = dict(reversed(r.resource))  # the first occurrence of a key
    for lab, key in INDEX:
        if key in res and text_of(res[key]) is not None:
            e.add(lab, text_of(res[key]), STREAM)
    e.add("service_name", "unknown_service", STREAM)
    for k, v in r.resource:
        if k not in INDEX_KEYS:
            add_attr(e, k, v, META)
    name, version, scope_attrs = r.scope
    if name:
        e.add("scope_name", name, META)
    if version:
        e.add("scope_version", version, META)
    for k, v in scope_attrs:
        add_attr(e, k, v, META)
    for k, v in r.attrs:
        add_attr(e, k, v, META)
    if r.sev_text:
        e.add("severity_text", r.sev_text, META)
    if r.sev_num:
        e.add("severity_number", str(r.sev_num), META)
    if r.trace_id:
        e.add("trace_id", r.trace_id.hex(), META)
    if r.span_id:
        e.add("span_id", r.span_id.hex(), META)
    if r.flags:
        e.add("flags", str(r.flags), META)
    if r.observed:
        e.add("observed_timestamp", str(r.observed), META)
    e.add("detected_level", detected_level(r.sev_text, r.sev_num), META)
    return e


# ----------------------------------------------------------------------------------------------
# LogQL: lexer and parser for the subset the cases below use

DUR_UNITS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": MS, "s": S, "m": MIN, "h": 60 * MIN,
             "d": 24 * 60 * MIN, "w": 7 * 24 * 60 * MIN, "y": 365 * 24 * 60 * MIN}
BYTE_UNITS = {"b": 1.0, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15, "kib": 1024.0,
              "mib": 1024.0 ** 2, "gib": 1024.0 ** 3, "tib": 1024.0 ** 4, "pib": 1024.0 ** 5}
OPS = ["|=", "|~", "!=", "!~", "=~", "==", ">=", "<=", "=", ">", "<", "|", "{", "}", "(", ")", "[", "]",
       ",", "+", "-", "*", "/", "%", "^"]
DUR_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h|d|w|y)")


def lex(src):
    toks, i = [], 0
    while i < len(src):
        c = src[i]
        if c.isspace():
            i += 1
        elif c == '"':
            j, out = i + 1, []
            while src[j] != '"':
                if src[j] == "\\":
                    nxt = src[j + 1]
                    if nxt == "u":
                        out.append(chr(int(src[j + 2:j + 6], 16)))
                        j += 6
                    else:
                        out.append({"n": "\n", "t": "\t", "r": "\r"}.get(nxt, nxt))
                        j += 2
                else:
                    out.append(src[j])
                    j += 1
            toks.append(("str", "".join(out)))
            i = j + 1
        elif c == "`":
            j = src.index("`", i + 1)
            toks.append(("str", src[i + 1:j]))
            i = j + 1
        elif c.isdigit():
            text = re.compile(r"[0-9.]+[A-Za-zµ0-9.]*").match(src, i).group(0)
            i += len(text)
            if re.fullmatch(r"\d+(\.\d+)?", text):
                toks.append(("num", float(text)))
            elif re.fullmatch(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h|d|w|y))+", text):
                toks.append(("dur", round(sum(float(n) * DUR_UNITS[u] for n, u in DUR_PART.findall(text)))))
            else:
                m = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]+)", text)
                toks.append(("bytes", float(m.group(1)) * BYTE_UNITS[m.group(2).lower()]))
        elif c.isalpha() or c == "_":
            text = re.compile(r"[A-Za-z_][A-Za-z0-9_]*").match(src, i).group(0)
            toks.append(("id", text))
            i += len(text)
        else:
            op = next(op for op in OPS if src.startswith(op, i))
            toks.append(("op", op))
            i += len(op)
    toks.append(("eof", None))
    return toks


VECTOR_AGGS = {"sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk"}
RANGE_AGGS = {"count_over_time", "rate", "bytes_over_time", "bytes_rate", "sum_over_time", "avg_over_time",
              "min_over_time", "max_over_time", "stddev_over_time", "stdvar_over_time",
              "quantile_over_time", "first_over_time", "last_over_time"}
UNWRAPPING = RANGE_AGGS - {"count_over_time", "rate", "bytes_over_time", "bytes_rate"}
LEVELS = [("or",), ("and", "unless"), ("==", "!=", ">", "<", ">=", "<="), ("+", "-"), ("*", "/", "%"), ("^",)]


class Parser:
    def __init__(self, src):
        self.t, self.i = lex(src), 0

    def peek(self, k=0):
        return self.t[self.i + k]

    def next(self):
        self.i += 1
        return self.t[self.i - 1]

    def is_op(self, op):
        return self.peek() == ("op", op)

    def is_id(self, name):
        return self.peek() == ("id", name)

    def expect_op(self, op):
        tok = self.next()
        assert tok == ("op", op), (tok, op)

    def expect(self, kind):
        tok = self.next()
        assert tok[0] == kind, (tok, kind)
        return tok[1]

    def parse(self):
        e = self.expr(0)
        assert self.peek()[0] == "eof", self.peek()
        return e

    def expr(self, level):
        if level == len(LEVELS):
            return self.primary()
        lhs = self.expr(level + 1)
        while self.peek()[0] in ("op", "id") and self.peek()[1] in LEVELS[level]:
            op = self.next()[1]
            is_bool = False
            if self.is_id("bool"):
                self.next()
                is_bool = True
            matching = None
            if self.is_id("on") or self.is_id("ignoring"):
                matching = (self.next()[1] == "on", self.label_list())
            rhs = self.expr(level if op == "^" else level + 1)
            lhs = ("bin", op, lhs, rhs, is_bool, matching)
        return lhs

    def primary(self):
        kind, v = self.peek()
        if kind == "num":
            self.next()
            return ("num", v)
        if self.is_op("("):
            self.next()
            e = self.expr(0)
            self.expect_op(")")
            return e
        if self.is_op("{"):
            return ("log", self.log_expr())
        if v == "vector":
            self.next()
            self.expect_op("(")
            n = self.expect("num")
            self.expect_op(")")
            return ("vector", n)
        if v in VECTOR_AGGS:
            self.next()
            grouping = self.grouping()
            self.expect_op("(")
            param = None
            if v in ("topk", "bottomk"):
                param = self.expect("num")
                self.expect_op(",")
            inner = self.expr(0)
            self.expect_op(")")
            return ("agg", v, grouping or self.grouping(), param, inner)
        if v in RANGE_AGGS:
            self.next()
            self.expect_op("(")
            param = None
            if v == "quantile_over_time":
                param = self.expect("num")
                self.expect_op(",")
            log = self.log_expr()
            self.expect_op("[")
            rng = self.expect("dur")
            self.expect_op("]")
            offset = 0
            if self.is_id("offset"):
                self.next()
                offset = self.expect("dur")
            self.expect_op(")")
            return ("range", v, param, log, rng, offset, self.grouping())
        raise AssertionError(f"unexpected {self.peek()}")

    def grouping(self):
        if self.is_id("by") or self.is_id("without"):
            return (self.next()[1] == "without", self.label_list())
        return None

    def label_list(self):
        self.expect_op("(")
        names = []
        while not self.is_op(")"):
            names.append(self.expect("id"))
            if self.is_op(","):
                self.next()
        self.expect_op(")")
        return names

    def log_expr(self):
        self.expect_op("{")
        sel = []
        while not self.is_op("}"):
            name = self.expect("id")
            op = self.next()[1]
            assert op in ("=", "!=", "=~", "!~"), op
            sel.append((name, op, self.expect("str")))
            if self.is_op(","):
                self.next()
        self.expect_op("}")
        stages = []
        while True:
            kind, v = self.peek()
            if kind == "op" and v in ("|=", "!=", "|~", "!~"):
                self.next()
                vals = [self.expect("str")]
                while self.is_id("or") and self.peek(1)[0] == "str":
                    self.next()
                    vals.append(self.expect("str"))
                stages.append(("line", v, vals))
            elif self.is_op("|"):
                self.next()
                stages.append(self.stage())
            else:
                return (sel, stages)

    def stage(self):
        v = self.peek()[1]
        if v in ("json", "logfmt"):
            self.next()
            params = []
            while self.peek()[0] == "id":
                label, expr = self.next()[1], None
                if self.is_op("="):
                    self.next()
                    expr = self.expect("str")
                params.append((label, expr))
                if not self.is_op(","):
                    break
                self.next()
            return (v, params)
        if v == "line_format":
            self.next()
            return ("line_format", self.expect("str"))
        if v == "label_format":
            self.next()
            items = []
            while True:
                dst = self.expect("id")
                self.expect_op("=")
                kind, src = self.next()
                items.append((dst, ("rename" if kind == "id" else "template", src)))
                if not self.is_op(","):
                    return ("label_format", items)
                self.next()
        if v in ("drop", "keep"):
            self.next()
            names = []
            while True:
                name, matcher = self.expect("id"), None
                if self.peek()[0] == "op" and self.peek()[1] in ("=", "!=", "=~", "!~"):
                    matcher = (self.next()[1], self.expect("str"))
                names.append((name, matcher))
                if not self.is_op(","):
                    return (v, names)
                self.next()
        if v == "unwrap":
            self.next()
            if self.peek(1) == ("op", "(") and self.peek()[1] in ("duration", "duration_seconds", "bytes"):
                conv = "bytes" if self.next()[1] == "bytes" else "duration"
                self.expect_op("(")
                label = self.expect("id")
                self.expect_op(")")
                return ("unwrap", label, conv)
            return ("unwrap", self.expect("id"), None)
        return ("filter", self.filter_or())

    def filter_or(self):
        f = self.filter_and()
        while self.is_id("or"):
            self.next()
            f = ("or", f, self.filter_and())
        return f

    def filter_and(self):
        f = self.filter_atom()
        while self.is_id("and") or self.is_op(","):
            self.next()
            f = ("and", f, self.filter_atom())
        return f

    def filter_atom(self):
        if self.is_op("("):
            self.next()
            f = self.filter_or()
            self.expect_op(")")
            return f
        name = self.expect("id")
        op = self.next()[1]
        kind, val = self.next()
        if kind == "str":
            assert op in ("=", "!=", "=~", "!~"), op
            return ("str", name, op, val)
        conv = {"num": None, "dur": "duration", "bytes": "bytes"}[kind]
        return ("num", name, op, val / S if kind == "dur" else val, conv)


# ----------------------------------------------------------------------------------------------
# LogQL: the pipeline

def str_test(op, want, got):
    if op == "=":
        return got == want
    if op == "!=":
        return got != want
    hit = re.fullmatch(want, got) is not None
    return hit if op == "=~" else not hit


def parse_f64(v):
    if "_" in v:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def duration_seconds(v):
    neg, rest = False, v
    if rest.startswith("-"):
        neg, rest = True, rest[1:]
    elif rest.startswith("+"):
        rest = rest[1:]
    if rest == "0":
        return 0.0
    total, seen = 0.0, False
    while rest:
        n = next((k for k, c in enumerate(rest) if not ("0" <= c <= "9" or c == ".")), len(rest))
        num = parse_f64(rest[:n])
        if num is None:
            return None
        rest = rest[n:]
        u = next((k for k, c in enumerate(rest) if "0" <= c <= "9" or c == "."), len(rest))
        unit = {"us": "us", "µs": "us", "μs": "us"}.get(rest[:u], rest[:u])
        if unit not in DUR_UNITS:
            return None
        total += num * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0,
                        "w": 604800.0, "y": 31_536_000.0}[unit]
        rest = rest[u:]
        seen = True
    return (-total if neg else total) if seen else None


def size_bytes(v):
    n = next((k for k, c in enumerate(v) if not ("0" <= c <= "9" or c == ".")), len(v))
    num = parse_f64(v[:n])
    unit = v[n:].strip().lower()
    scale = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "ki": 1024.0, "mi": 1024.0 ** 2,
             "gi": 1024.0 ** 3, "ti": 1024.0 ** 4, "pi": 1024.0 ** 5, **BYTE_UNITS}.get(unit)
    return None if num is None or scale is None else num * scale


def convert(v, conv):
    v = v.strip()
    if conv == "duration":
        return duration_seconds(v)
    if conv == "bytes":
        return size_bytes(v)
    return parse_f64(v)


def add_parsed(e, name, value):
    """A parsed label; a name a non-parsed label holds gets `_extracted`."""
    name = label_name(name)
    if e.get(name) is not None and e.kind(name) != PARSED:
        e.set(name + "_extracted", value, PARSED)
    else:
        e.set(name, value, PARSED)


def json_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return ""
    if isinstance(v, (int, str)):
        return str(v)
    raise AssertionError(f"the dataset's JSON holds no {v!r}")


def json_flatten(e, prefix, v):
    if isinstance(v, dict):
        for k, inner in v.items():
            json_flatten(e, f"{prefix}_{k}" if prefix else k, inner)
    elif not isinstance(v, list):
        add_parsed(e, prefix, json_text(v))


def json_stage(e, params):
    try:
        v = json.loads(e.line)
    except ValueError:
        v = None
    if not isinstance(v, dict):
        e.set(ERROR, "JSONParserErr", PARSED)
        e.set("__error_details__", "(not predicted)", PARSED)
        return
    if not params:
        json_flatten(e, "", v)
        return
    for label, expr in params:
        cur = v
        for key, index in re.findall(r"\.?([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]", expr or label):
            if key:
                cur = cur.get(key) if isinstance(cur, dict) else None
            else:
                cur = cur[int(index)] if isinstance(cur, list) and int(index) < len(cur) else None
        text = "" if cur is None else json_text(cur) if not isinstance(cur, (dict, list)) else json.dumps(cur)
        e.set(label_name(label), text, PARSED)


def logfmt_pairs(line):
    """logfmt pairs; ValueError on a malformed line."""
    i, n, out = 0, len(line), []
    while i < n:
        while i < n and line[i] == " ":
            i += 1
        if i >= n:
            break
        ks = i
        while i < n and line[i] > " " and line[i] not in '="':
            i += 1
        key = line[ks:i]
        if not key:
            raise ValueError(i)
        if i >= n or line[i] != "=":
            out.append((key, ""))
            continue
        i += 1
        if i < n and line[i] == '"':
            j, v, closed = i + 1, [], False
            while j < n:
                c = line[j]
                if c == '"':
                    closed, i = True, j + 1
                    break
                if c == "\\":
                    if j + 1 < n:
                        v.append({"n": "\n", "t": "\t"}.get(line[j + 1], line[j + 1]))
                    j += 2
                    continue
                v.append(c)
                j += 1
            if not closed:
                raise ValueError(key)
            out.append((key, "".join(v)))
        else:
            vs = i
            while i < n and line[i] != " ":
                i += 1
            out.append((key, line[vs:i]))
    return out


def logfmt_stage(e, params):
    end = len(e.line)
    while True:  # not strict: the pairs before the first malformed one
        try:
            pairs = logfmt_pairs(e.line[:end])
            break
        except ValueError:
            end = e.line.rfind(" ", 0, end)
            if end < 0:
                pairs = []
                break
    if not params:
        for k, v in pairs:
            if v:
                add_parsed(e, k, v)
        return
    for label, key in params:
        found = [v for k, v in pairs if k == (key or label)]
        if found:
            e.set(label_name(label), found[-1], PARSED)


def filter_ok(f, e):
    if f[0] == "and":
        return filter_ok(f[1], e) and filter_ok(f[2], e)
    if f[0] == "or":
        return filter_ok(f[1], e) or filter_ok(f[2], e)
    if f[0] == "str":
        _, name, op, want = f
        return str_test(op, want, e.get(name) or "")
    _, name, op, want, conv = f
    raw = e.get(name)
    if raw is None:
        return False
    got = convert(raw, conv)
    if got is None:
        e.set(ERROR, "LabelFilterErr", PARSED)
        return True
    return {"==": got == want, "=": got == want, "!=": got != want, ">": got > want, ">=": got >= want,
            "<": got < want, "<=": got <= want}[op]


def render(template, e):
    return re.sub(r"\{\{\s*\.([A-Za-z0-9_]+)\s*\}\}", lambda m: e.get(m.group(1)) or "", template)


def run_log(log, r):
    """(entry, unwrapped value) after the selector and the pipeline, or None."""
    sel, stages = log
    e = model_entry(r)
    if not all(str_test(op, want, e.get(name) or "") for name, op, want in sel):
        return None
    value = None
    for st in stages:
        kind = st[0]
        if kind == "line":
            _, op, vals = st
            text = e.filter_text()
            if op in ("|=", "!="):
                hit = any(v in text for v in vals)
            else:
                hit = any(re.search(v, text) for v in vals)
            if hit != (op in ("|=", "|~")):
                return None
        elif kind == "json":
            json_stage(e, st[1])
        elif kind == "logfmt":
            logfmt_stage(e, st[1])
        elif kind == "filter":
            if not filter_ok(st[1], e):
                return None
        elif kind == "line_format":
            e.line, e.is_text = render(st[1], e), True
        elif kind == "label_format":
            for dst, (how, src) in st[1]:
                if how == "rename":
                    val = e.get(src) or ""
                    e.remove(src)
                else:
                    val = render(src, e)
                e.set(dst, val, PARSED)
        elif kind in ("drop", "keep"):
            def named(lab):
                return any(n == lab[0] and (m is None or str_test(m[0], m[1], lab[1])) for n, m in st[1])
            e.labels = [lab for lab in e.labels if named(lab) == (kind == "keep")]
        elif kind == "unwrap":
            _, label, conv = st
            raw = e.get(label)
            value = None if raw is None else convert(raw, conv)
            if value is None:
                e.set(ERROR, "SampleExtractionErr", PARSED)
            e.remove(label)
        else:
            raise AssertionError(kind)
    return e, value


def log_query(query, recs, start, end, limit, direction):
    """A log query's entries in [start, end), in answer order, at most `limit`."""
    tree = Parser(query).parse()
    assert tree[0] == "log", query
    got = [x[0] for r in recs if start <= r.ts < end for x in [run_log(tree[1], r)] if x]
    got.sort(key=lambda e: e.ts, reverse=direction == "backward")
    return got[:limit]


# ----------------------------------------------------------------------------------------------
# LogQL: metric queries (Loki's range semantics; PromQL's aggregation and binary rules)

class PipelineError(Exception):
    pass


def fs(d):
    return frozenset(d.items())


def quantile(q, w):
    w = sorted(w)
    rank = q * (len(w) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(w) - 1)
    return w[lo] * (1 - (rank - lo)) + w[hi] * (rank - lo)


def range_value(op, w, secs, param, unwrapped):
    n, total = len(w), sum(w)
    if op == "count_over_time":
        return float(n)
    if op == "rate":
        return (total if unwrapped else n) / secs
    if op in ("bytes_over_time", "sum_over_time"):
        return total
    if op == "bytes_rate":
        return total / secs
    if op == "avg_over_time":
        return total / n
    if op == "min_over_time":
        return min(w)
    if op == "max_over_time":
        return max(w)
    if op == "first_over_time":
        return w[0]
    if op == "last_over_time":
        return w[-1]
    if op in ("stddev_over_time", "stdvar_over_time"):
        var = sum((x - total / n) ** 2 for x in w) / n
        return var if op == "stdvar_over_time" else math.sqrt(var)
    if op == "quantile_over_time":
        return quantile(param, w)
    raise AssertionError(op)


def group_key(labels, grouping):
    without, names = grouping
    if without:
        return fs({k: v for k, v in labels.items() if k not in names})
    return fs({k: v for k, v in labels.items() if k in names})


def eval_range(node, steps, recs):
    _, op, param, log, rng, offset, grouping = node
    unwraps = any(st[0] == "unwrap" for st in log[1])
    if op in UNWRAPPING and not unwraps:
        raise ValueError(f"invalid aggregation {op} without unwrap")
    lo_read, hi_read = steps[0] * MS - rng - offset, steps[-1] * MS - offset
    series = {}
    for r in recs:
        if not lo_read < r.ts <= hi_read:
            continue
        got = run_log(log, r)
        if not got:
            continue
        e, v = got
        labels = e.all()
        # Loki checks for errors before grouping (LabelsBuilder.GroupedLabels).
        if ERROR in labels:
            raise PipelineError(labels[ERROR])
        if op in ("bytes_over_time", "bytes_rate"):
            v = float(len(e.line.encode()))
        elif not unwraps:
            v = 1.0
        key = group_key(labels, grouping) if grouping else fs(labels)
        series.setdefault(key, []).append((r.ts, v))
    out = {t: {} for t in steps}
    for key, pts in series.items():
        pts.sort()
        for t in steps:
            hi = t * MS - offset
            w = [v for ts, v in pts if hi - rng < ts <= hi]
            if w:
                out[t][key] = range_value(op, w, rng / S, param, unwraps)
    return out


def aggregate(op, grouping, param, vec):
    groups = {}
    for labels, v in vec.items():
        key = group_key(dict(labels), grouping) if grouping else frozenset()
        groups.setdefault(key, []).append((labels, v))
    out = {}
    for key, members in groups.items():
        vals = [v for _, v in members]
        if op in ("topk", "bottomk"):
            members.sort(key=lambda m: m[1], reverse=op == "topk")
            out.update(members[:int(param)])
            continue
        n, total = len(vals), sum(vals)
        out[key] = {"sum": total, "avg": total / n, "min": min(vals), "max": max(vals), "count": float(n),
                    "stdvar": sum((x - total / n) ** 2 for x in vals) / n,
                    "stddev": math.sqrt(sum((x - total / n) ** 2 for x in vals) / n)}[op]
    return out


COMPARISONS = {"==", "!=", ">", "<", ">=", "<="}


def arith(op, a, b):
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b if b else (math.nan if a == 0 else math.copysign(math.inf, a))
    if op == "%":
        return math.fmod(a, b)
    if op == "^":
        return a ** b
    return {"==": a == b, "!=": a != b, ">": a > b, "<": a < b, ">=": a >= b, "<=": a <= b}[op]


def signature(labels, matching):
    d = dict(labels)
    if matching is None:
        return labels
    on, names = matching
    return fs({k: v for k, v in d.items() if (k in names) == on})


def binary(node, steps, lhs, rhs):
    _, op, _, _, is_bool, matching = node
    if lhs[0] == "scalar" and rhs[0] == "scalar":
        return ("scalar", arith(op, lhs[1], rhs[1]))
    out = {t: {} for t in steps}
    for t in steps:
        if lhs[0] == "scalar" or rhs[0] == "scalar":
            vec, scalar_left = (rhs[1][t], True) if lhs[0] == "scalar" else (lhs[1][t], False)
            s = lhs[1] if scalar_left else rhs[1]
            for labels, v in vec.items():
                r = arith(op, s, v) if scalar_left else arith(op, v, s)
                if op in COMPARISONS:
                    if is_bool:
                        out[t][labels] = float(r)
                    elif r:
                        out[t][labels] = v
                else:
                    out[t][labels] = r
            continue
        lv, rv = lhs[1][t], rhs[1][t]
        right = {}
        for labels, v in rv.items():
            sig = signature(labels, matching)
            assert sig not in right, "many-to-one matching is not used by these cases"
            right[sig] = v
        if op in ("and", "or", "unless"):
            left_sigs = {signature(lab, matching) for lab in lv}
            for labels, v in lv.items():
                hit = signature(labels, matching) in right
                if op == "or" or (op == "and") == hit:
                    out[t][labels] = v
            if op == "or":
                for labels, v in rv.items():
                    if signature(labels, matching) not in left_sigs:
                        out[t][labels] = v
            continue
        for labels, v in lv.items():
            sig = signature(labels, matching)
            if sig not in right:
                continue
            r = arith(op, v, right[sig])
            result_labels = sig if matching and matching[0] else (
                fs({k: x for k, x in labels if k not in matching[1]}) if matching else labels)
            if op in COMPARISONS:
                if is_bool:
                    out[t][result_labels] = float(r)
                elif r:
                    out[t][result_labels] = v
            else:
                out[t][result_labels] = r
    return ("vector", out)


def eval_node(node, steps, recs):
    kind = node[0]
    if kind == "num":
        return ("scalar", node[1])
    if kind == "vector":
        return ("vector", {t: {frozenset(): node[1]} for t in steps})
    if kind == "range":
        return ("vector", eval_range(node, steps, recs))
    if kind == "agg":
        _, op, grouping, param, inner = node
        v = eval_node(inner, steps, recs)
        assert v[0] == "vector"
        return ("vector", {t: aggregate(op, grouping, param, v[1][t]) for t in steps})
    if kind == "bin":
        return binary(node, steps, eval_node(node[2], steps, recs), eval_node(node[3], steps, recs))
    raise AssertionError(node)


def metric_query(query, recs, start, end, step_ms, instant):
    """{labels: {step ms: value}} of a metric query, or PipelineError."""
    steps = [end // MS] if instant else list(range(start // MS, end // MS + 1, step_ms))
    res = eval_node(Parser(query).parse(), steps, recs)
    assert res[0] == "vector", query
    out = {}
    for t, vec in res[1].items():
        for labels, v in vec.items():
            out.setdefault(labels, {})[t] = v
    return out


# ----------------------------------------------------------------------------------------------
# The dataset

SERVICES = ["checkout", "cart", "auth"]
N = 300
SEVERITIES = [("TRACE", 1), ("DEBUG", 5), ("INFO", 9), ("WARN", 13), ("ERROR", 17), ("FATAL", 21), ("info", 0),
              ("Warning", 0), ("err", 0), ("notice", 10), ("crit", 0), ("", 3), ("", 7), ("", 11), ("", 15),
              ("", 19), ("", 23), ("", 0), ("bogus", 17), ("WARNING", 17), ("dbg", 0), ("Information", 9),
              ("panic", 0), ("trc", 2), ("EMERG", 0), ("eror", 0)]
TRACE_X = bytes.fromhex("5ca1ab1e0ddba11c0ffee000000000a1")
CHUNK = 60  # records per export: with --seal-size 1 each export seals a block of its own


def dataset(base):
    rng = random.Random(20261204)
    recs = []
    for i in range(N):
        svc = SERVICES[i % 3]
        slot = base + i * 4 * S
        # Every 15th record sits exactly on a minute boundary (a step of the 1m cases).
        ts = slot if i % 15 == 0 else slot + rng.randrange(1, 4000) * MS + rng.randrange(0, MS)
        pod = f"{svc}-{rng.choice([1, 2])}"
        resource = [("service.name", svc), ("k8s.pod.name", pod),
                    ("deployment.environment", "staging" if svc == "auth" else "prod"),
                    ("host.name", "node-a" if pod.endswith("1") else "node-b")]
        scope = {"checkout": ("shop.logger", "2.1", [("scope.tier", "web")]),
                 "cart": ("shop.logger", "2.1", []), "auth": ("auth.lib", "", [])}[svc]
        sev_text, sev_num = rng.choice(SEVERITIES)
        status = rng.choice([200, 200, 200, 201, 404, 500, 503])
        ms = rng.choice([5, 12, 48, 120, 180, 320, 750, 1500, 2400])
        user = rng.choice(["ann", "bob", "cid", "dee"])
        kind = rng.choice(["plain", "logfmt", "json"])
        broken_latency = i in (7, 43, 88, 131, 200) or i % 37 == 5
        if kind == "plain":
            body = (f"{rng.choice(['GET', 'POST', 'PUT'])} /api/{rng.choice(['orders', 'items', 'login'])} took {ms}ms"
                    + rng.choice(["", "", " timeout", " connection refused", " Error while flushing",
                                  " error: retry later"])
                    + (" — café ☕" if i % 11 == 4 else ""))
        elif kind == "logfmt":
            latency = "n/a" if broken_latency else f"{ms}ms"
            body = (f"level={rng.choice(['debug', 'info', 'warn', 'error'])} latency={latency} status={status} "
                    f"user={user} size={rng.choice(['300B', '1.5KiB', '12KB', '2MiB', '900B'])} "
                    f'msg="{rng.choice(["order placed", "cache miss", "upstream timeout"])}" '
                    f"http.method={'GET' if i % 2 else 'POST'}")
        else:
            latency = "n/a" if broken_latency else f"{ms / 1000:g}s"
            body = json.dumps({"status": status, "latency": latency, "user": {"name": user},
                               "size": rng.choice([300, 2048, 65536]), "path": "/api/orders", "tags": ["a", "b"], "req-id": f"r-{i}"},
                              separators=(",", ":"))
        attrs = []
        if rng.random() < 0.75:
            attrs.append(("http.status_code", status))
        if svc != "auth" and rng.random() < 0.8:
            attrs.append(("user.id", f"u-{rng.randint(1, 4)}"))
        if rng.random() < 0.25:
            attrs.append(("level", rng.choice(["info", "warn", "error"])))
        if svc == "cart" and rng.random() < 0.4:
            attrs.append(("retry", rng.choice([True, False])))
        if svc == "auth" and rng.random() < 0.5:
            attrs.append(("elapsed", rng.choice([0.25, 1.5, 2.0, 12.75])))
        if svc == "checkout" and rng.random() < 0.3:
            attrs.append(("http.request", {"method": rng.choice(["GET", "POST"]), "route": "/api/orders"}))
        if svc == "auth" and i % 5 == 1:
            attrs.append(("naïve.flag", "oui"))
        r = Rec(ts=ts, resource=resource, scope=scope, attrs=attrs, body=body, sev_text=sev_text, sev_num=sev_num)
        if rng.random() < 0.25:
            r.trace_id, r.span_id, r.flags = rng.randbytes(16), rng.randbytes(8), 1
        if svc == "auth" and 2 * CHUNK <= i < 3 * CHUNK and i % 4 == 2:
            r.trace_id, r.span_id, r.flags = TRACE_X, rng.randbytes(8), 1
        if i % 10 == 3:
            r.observed = ts + 5 * MS
        recs.append(r)
    return recs


def small_set(base, svc, lines, step=10 * S, attrs=()):
    return [Rec(ts=base + k * step + 123, resource=[("service.name", svc), ("k8s.pod.name", f"{svc}-0")],
                scope=("e2e", "", []), attrs=list(attrs), body=line, sev_text="INFO", sev_num=9)
            for k, line in enumerate(lines)]


# ----------------------------------------------------------------------------------------------
# OTLP and HTTP

def any_value(v):
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    if isinstance(v, str):
        return AnyValue(string_value=v)
    if isinstance(v, dict):
        return AnyValue(kvlist_value=KeyValueList(values=[KeyValue(key=k, value=any_value(x)) for k, x in v.items()]))
    raise TypeError(v)


def kvs(pairs):
    return [KeyValue(key=k, value=any_value(v)) for k, v in pairs]


def export_body(recs):
    req = ExportLogsServiceRequest()
    scopes = {}
    for r in recs:
        key = repr((r.resource, r.scope))
        if key not in scopes:
            rl = req.resource_logs.add()
            rl.resource.attributes.extend(kvs(r.resource))
            sl = rl.scope_logs.add()
            sl.scope.name, sl.scope.version = r.scope[0], r.scope[1]
            sl.scope.attributes.extend(kvs(r.scope[2]))
            scopes[key] = sl
        lr = scopes[key].log_records.add()
        lr.time_unix_nano = r.ts
        lr.observed_time_unix_nano = r.observed
        lr.severity_text, lr.severity_number = r.sev_text, r.sev_num
        if r.body is not None:
            lr.body.CopyFrom(any_value(r.body))
        lr.attributes.extend(kvs(r.attrs))
        lr.trace_id, lr.span_id, lr.flags = r.trace_id, r.span_id, r.flags
    return req.SerializeToString()


def send(s, recs, tenant=None):
    headers = {"Content-Type": "application/x-protobuf"}
    if tenant:
        headers["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(f"http://{s.http}/v1/logs", data=export_body(recs), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200
        answer = ExportLogsServiceResponse.FromString(r.read())
    assert answer.partial_success.rejected_log_records == 0, answer


@dataclass
class Reply:
    status: int
    ctype: str
    text: str
    json: object = None


def call(s, path, params=None, tenant=None, headers=None):
    url = f"http://{s.query}{path}"
    if params is not None:
        url += "?" + urllib.parse.urlencode(params, doseq=True)
    h = dict(headers or {})
    if tenant:
        h["X-Scope-OrgID"] = tenant
    req = urllib.request.Request(url, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            status, ctype, body = r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        status, ctype, body = e.code, e.headers.get("Content-Type", ""), e.read()
    text = body.decode("utf-8", "replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    return Reply(status, ctype, text, parsed)


def ok(reply):
    assert reply.status == 200, f"{reply.status}: {reply.text[:2000]}"
    return reply.json


HEALTH = "/loki/api/v1/query?direction=backward&query=vector%281%29%2Bvector%281%29&time=4000000000"
# Loki reads an integer time of at most 10 digits as seconds (pkg/loghttp/params.go parseTimestamp), so
# Grafana's `time=4000000000` (meant as 4 s in ns) is 4e9 s; Grafana checks only fields, rows and the value.
HEALTH_RESULT = [{"metric": {}, "value": [4_000_000_000, "2"]}]


# ----------------------------------------------------------------------------------------------
# The server and its data

@dataclass
class Loki:
    s: Serve
    base: int
    recs: list
    tenants: dict = field(default_factory=dict)

    @property
    def end(self):
        return self.base + 20 * MIN


def count_of(s, selector, at, tenant=None):
    r = call(s, "/loki/api/v1/query", {"query": f"sum(count_over_time({selector}[2h]))", "time": at,
                                       "limit": 1000}, tenant=tenant)
    if r.status == 400 and "not implemented" in r.text:
        raise AssertionError(f"Mira's LogQL parser is not there yet: {r.text}")
    assert r.status == 200, r.text
    result = r.json["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


@pytest.fixture(scope="module")
def loki():
    # Every export seals a block of its own, so that trace-to-logs has blocks to prune.
    s = Serve("--seal-size", "1")
    try:
        now = time.time_ns()
        base = now // MIN * MIN - 30 * MIN
        recs = dataset(base)
        for k in range(0, N, CHUNK):
            send(s, recs[k:k + CHUNK])
        d = Loki(s, base, recs)
        d.tenants = {
            "tenant-a": small_set(base, "vault", [f"vault unsealed {k}" for k in range(6)],
                                  attrs=[("secret.token", "s3cr3t")]),
            "tenant-b": small_set(base, "ledger", [f"ledger entry {k}" for k in range(4)]),
            "bodies": [Rec(ts=base + (k + 1) * S, resource=[("service.name", "bodies")], scope=("", "", []),
                           attrs=[], body=b)
                       for k, b in enumerate([{"msg": "structured"}, "plain structured", 42, "a" * 5000])]
            + [Rec(ts=base + 9 * S, resource=[("k8s.pod.name", "nameless")], scope=("", "", []), attrs=[],
                   body="no service here")],
        }
        for tenant, rs in d.tenants.items():
            send(s, rs, tenant=tenant)
        at = now + MIN
        wait_until("the dataset to be queryable", lambda: count_of(s, '{service_name=~".+"}', at) == N)
        for tenant, rs in d.tenants.items():
            wait_until(f"{tenant}'s records", lambda: count_of(s, '{service_name=~".+"}', at, tenant) == len(rs))
        yield d
    finally:
        s.kill()


# ----------------------------------------------------------------------------------------------
# Comparing answers

def close(a, b):
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def show(labels):
    return "{" + ", ".join(f"{k}={v!r}" for k, v in sorted(labels)) + "}"


def matrix_of(data):
    assert data["resultType"] == "matrix", data["resultType"]
    out = {}
    for s in data["result"]:
        key = fs(s["metric"])
        assert key not in out, f"two series {show(key)}"
        assert all(isinstance(v, str) for v in s["metric"].values())
        pts = {}
        for t, v in s["values"]:
            assert isinstance(t, (int, float)) and isinstance(v, str), (t, v)
            pts[round(t * 1000)] = float(v)
        assert pts, f"an empty series {show(key)}"
        out[key] = pts
    return out


def vector_of(data, at_ms):
    assert data["resultType"] == "vector", data["resultType"]
    out = {}
    for s in data["result"]:
        t, v = s["value"]
        assert isinstance(t, (int, float)) and isinstance(v, str), s
        assert round(t * 1000) == at_ms, (t, at_ms)
        out[fs(s["metric"])] = {at_ms: float(v)}
    return out


def assert_series_equal(got, want):
    missing = [show(k) for k in want if k not in got]
    extra = [show(k) for k in got if k not in want]
    assert not missing and not extra, f"series missing {missing[:5]} ({len(missing)}), extra {extra[:5]} ({len(extra)})"
    for k, pts in want.items():
        assert set(got[k]) == set(pts), (f"{show(k)}: steps missing {sorted(set(pts) - set(got[k]))[:5]}, "
                                         f"extra {sorted(set(got[k]) - set(pts))[:5]}")
        bad = [(t, got[k][t], v) for t, v in sorted(pts.items()) if not close(got[k][t], v)]
        assert not bad, f"{show(k)}: (step ms, got, want) {bad[:5]}"


def assert_topk(got, inner, k, grouping, bottom):
    """topk/bottomk: at each step each group returns min(k, n) of its series with the k largest
    (smallest) values; which series wins a tie is not specified."""
    steps = {t for pts in inner.values() for t in pts} | {t for pts in got.values() for t in pts}
    for t in sorted(steps):
        now = {lab: pts[t] for lab, pts in inner.items() if t in pts}
        picked = {lab: pts[t] for lab, pts in got.items() if t in pts}
        groups = {}
        for lab, v in now.items():
            groups.setdefault(group_key(dict(lab), grouping) if grouping else frozenset(), []).append(v)
        for lab, v in picked.items():
            assert lab in now and close(now[lab], v), f"step {t}: {show(lab)}={v} is not an input series"
        for g, vals in groups.items():
            mine = sorted((v for lab, v in picked.items()
                           if (group_key(dict(lab), grouping) if grouping else frozenset()) == g), reverse=not bottom)
            best = sorted(vals, reverse=not bottom)[:k]
            assert len(mine) == len(best) and all(close(a, b) for a, b in zip(mine, best)), (t, show(g), mine, best)


def stream_entries(data, categorized, direction):
    """(ts, line, labels...) of a streams answer, checking Grafana's decoder's types."""
    assert data["resultType"] == "streams", data["resultType"]
    if categorized:
        assert data.get("encodingFlags") == ["categorize-labels"], data.get("encodingFlags")
    else:
        assert "encodingFlags" not in data or "categorize-labels" not in data["encodingFlags"]
    out, keys = [], set()
    for s in data["result"]:
        key = fs(s["stream"])
        assert key not in keys, f"two streams {show(key)}"
        keys.add(key)
        assert all(isinstance(v, str) for v in s["stream"].values())
        last = None
        for v in s["values"]:
            assert isinstance(v[0], str) and len(v[0]) == 19 and v[0].isdigit(), v[0]
            assert isinstance(v[1], str)
            ts = int(v[0])
            if last is not None:
                assert (ts < last) if direction == "backward" else (ts > last), f"out of order: {last} then {ts}"
            last = ts
            if categorized:
                assert len(v) == 3 and isinstance(v[2], dict), v
                extra = v[2]
                assert set(extra) <= {"structuredMetadata", "parsed"}, extra
                assert all(extra[k] for k in extra), f"an empty map is sent: {extra}"
                out.append((ts, v[1], key, fs(extra.get("structuredMetadata", {})), fs(extra.get("parsed", {}))))
            else:
                assert len(v) == 2, v
                out.append((ts, v[1], key))
    return sorted(out, key=lambda x: x[0])


def expected_entries(entries, categorized):
    if categorized:
        out = [(e.ts, e.line, fs(e.of(STREAM)), fs(e.of(META)), fs(e.of(PARSED))) for e in entries]
    else:
        out = [(e.ts, e.line, fs(e.all())) for e in entries]
    return sorted(out, key=lambda x: x[0])


def assert_entries_equal(got, want):
    if got == want:
        return
    g, w = set(got), set(want)
    raise AssertionError(f"{len(got)} entries, want {len(want)}; "
                         f"missing {sorted(w - g)[:3]}; unexpected {sorted(g - w)[:3]}")


# ----------------------------------------------------------------------------------------------
# 1. Grafana's health check

def test_grafanas_health_check_answers_a_vector_of_two(loki):
    r = call(loki.s, HEALTH)
    body = ok(r)
    assert "json" in r.ctype
    assert set(body) <= {"status", "data"} and body["status"] == "success", body
    assert set(body["data"]) <= {"resultType", "result", "stats"}, body
    assert body["data"]["resultType"] == "vector"
    assert body["data"]["result"] == HEALTH_RESULT, body["data"]["result"]


# ----------------------------------------------------------------------------------------------
# 2. The log-volume histogram Grafana runs beside every logs query

@pytest.mark.parametrize("svc", SERVICES)
def test_log_volume_counts_every_line_once_by_level(loki, svc):
    query = f'sum by (level, detected_level) (count_over_time({{service_name="{svc}"}} | drop __error__[1m]))'
    params = {"query": query, "direction": "backward", "limit": 1000, "start": loki.base, "end": loki.end,
              "step": "60000ms"}
    data = ok(call(loki.s, "/loki/api/v1/query_range", params, headers={"X-Query-Tags": "Source=logvolhist"}))["data"]
    got = matrix_of(data)
    assert_series_equal(got, metric_query(query, loki.recs, loki.base, loki.end, 60_000, False))
    # Step == range: the windows tile (base - 1m, end], so every line counts once.
    assert sum(v for pts in got.values() for v in pts.values()) == sum(
        1 for r in loki.recs if dict(r.resource)["service.name"] == svc)
    assert all(set(dict(lab)) <= {"level", "detected_level"} for lab in got)


# ----------------------------------------------------------------------------------------------
# 3. Log queries: ns strings, direction, limit, categorize-labels

def test_log_entries_are_ns_strings_in_direction_order_and_limited(loki):
    sel = '{service_name=~".+"}'
    for direction in ("backward", "forward"):
        for limit in (1, 7, 1000):
            data = ok(call(loki.s, "/loki/api/v1/query_range",
                           {"query": sel, "direction": direction, "limit": limit, "start": loki.base,
                            "end": loki.end, "step": "1000ms"}))["data"]
            got = stream_entries(data, False, direction)
            want = log_query(sel, loki.recs, loki.base, loki.end, limit, direction)
            assert len(got) == min(limit, N)
            assert_entries_equal(got, expected_entries(want, False))
    # The default limit (no `limit`) is Loki's 100.
    data = ok(call(loki.s, "/loki/api/v1/query_range", {"query": sel, "start": loki.base, "end": loki.end}))["data"]
    assert len(stream_entries(data, False, "backward")) == 100


def test_split_queries_join_without_gaps_or_duplicates(loki):
    """Grafana's query splitting: sub-ranges of a log query join on [start, end) (a line sits exactly on
    the split point), and step-aligned sub-ranges of a metric query give the whole query's points."""
    mid = loki.base + 10 * MIN
    assert any(r.ts == mid for r in loki.recs)
    sel = '{service_name="checkout"}'
    parts = []
    for start, end in ((loki.base, mid), (mid, loki.end)):
        data = ok(call(loki.s, "/loki/api/v1/query_range", {"query": sel, "direction": "backward", "limit": 1000,
                                                             "start": start, "end": end, "step": "1000ms"}))["data"]
        parts += stream_entries(data, False, "backward")
    whole = expected_entries(log_query(sel, loki.recs, loki.base, loki.end, 1000, "backward"), False)
    assert_entries_equal(sorted(parts, key=lambda x: x[0]), whole)
    query = f"sum by (service_name) (count_over_time({ALL}[1m]))"
    got = {}
    for start, end in ((loki.base, mid), (mid + 60 * S, loki.end)):
        data = ok(call(loki.s, "/loki/api/v1/query_range", {"query": query, "start": start, "end": end,
                                                             "step": "60000ms"}))["data"]
        for lab, pts in matrix_of(data).items():
            assert not set(got.get(lab, {})) & set(pts)
            got.setdefault(lab, {}).update(pts)
    assert_series_equal(got, metric_query(query, loki.recs, loki.base, loki.end, 60_000, False))


def test_categorize_labels_splits_stream_metadata_and_parsed(loki):
    query = '{service_name="checkout"} | logfmt | status >= 500'
    params = {"query": query, "direction": "backward", "limit": 1000, "start": loki.base, "end": loki.end,
              "step": "1000ms"}
    data = ok(call(loki.s, "/loki/api/v1/query_range", params,
                   headers={"X-Loki-Response-Encoding-Flags": "categorize-labels"}))["data"]
    got = stream_entries(data, True, "backward")
    assert got, "the case selects lines"
    for s in data["result"]:
        assert set(s["stream"]) == {"service_name", "k8s_pod_name", "deployment_environment"}, s["stream"]
    assert_entries_equal(got, expected_entries(log_query(query, loki.recs, loki.base, loki.end, 1000, "backward"),
                                               True))
    # Without the header: 2-tuples, every label in `stream`, no flags.
    data = ok(call(loki.s, "/loki/api/v1/query_range", params))["data"]
    assert_entries_equal(stream_entries(data, False, "backward"),
                         expected_entries(log_query(query, loki.recs, loki.base, loki.end, 1000, "backward"), False))


def test_a_non_string_body_is_its_json_and_line_filters_see_it_empty(loki):
    recs = loki.tenants["bodies"]
    for query, want in [('{service_name="bodies"}', {'{"msg":"structured"}', "plain structured", "42", "a" * 5000}),
                        ('{service_name="bodies"} |= "structured"', {"plain structured"}),
                        ('{service_name="bodies"} != "zzz"', {'{"msg":"structured"}', "plain structured", "42",
                                                              "a" * 5000}),
                        ('{service_name="bodies"} |~ "^$"', {'{"msg":"structured"}', "42"}),
                        ('{service_name="unknown_service"}', {"no service here"}),
                        ('{service_name=~"unknown.*", k8s_pod_name="nameless"}', {"no service here"}),
                        ('{service_name!="bodies", k8s_pod_name=~"name.*"}', {"no service here"})]:
        data = ok(call(loki.s, "/loki/api/v1/query_range",
                       {"query": query, "limit": 100, "start": loki.base, "end": loki.end}, tenant="bodies"))["data"]
        got = stream_entries(data, False, "backward")
        assert {line for _, line, _ in got} == want, query
        assert_entries_equal(got, expected_entries(log_query(query, recs, loki.base, loki.end, 100, "backward"),
                                                   False))


# ----------------------------------------------------------------------------------------------
# 4. Labels, values, series and tenants

def window(loki):
    return {"start": loki.base - MIN, "end": time.time_ns() + MIN}


def names_of(entries):
    return sorted({n for e in entries for n in e.all() if not n.startswith("__")})


def assert_names(got, want):
    assert got["status"] == "success" and got["data"] == sorted(got["data"]), got
    extra, missing = sorted(set(got["data"]) - set(want)), sorted(set(want) - set(got["data"]))
    assert not extra and not missing, f"names no line carries: {extra}; names lines carry, not listed: {missing}"


def test_labels_list_the_names_the_lines_carry(loki):
    every = [model_entry(r) for r in loki.recs]
    assert_names(ok(call(loki.s, "/loki/api/v1/labels", window(loki))), names_of(every))
    auth = [e for e in every if e.get("service_name") == "auth"]
    got = ok(call(loki.s, "/loki/api/v1/labels", {**window(loki), "query": '{service_name="auth"}'}))
    assert_names(got, names_of(auth))
    assert "user_id" not in got["data"] and "elapsed" in got["data"]


def test_label_values_list_what_was_sent(loki):
    every = [model_entry(r) for r in loki.recs]

    def values(name, entries):
        return sorted({e.get(name) for e in entries if e.get(name)})

    for name in ("service_name", "k8s_pod_name", "detected_level", "http_status_code", "severity_text",
                 "deployment_environment", "elapsed", "http_request_method"):
        got = ok(call(loki.s, f"/loki/api/v1/label/{name}/values", window(loki)))
        assert got == {"status": "success", "data": values(name, every)}, name
    assert values("service_name", every) == sorted(SERVICES)
    auth = [e for e in every if e.get("service_name") == "auth"]
    got = ok(call(loki.s, "/loki/api/v1/label/k8s_pod_name/values", {**window(loki), "query": '{service_name="auth"}'}))
    assert got == {"status": "success", "data": ["auth-1", "auth-2"]} == {"status": "success",
                                                                           "data": values("k8s_pod_name", auth)}


def test_series_lists_the_stream_label_sets(loki):
    for selectors in (['{service_name="auth"}'], ['{service_name="cart"}', '{k8s_pod_name="checkout-1"}'],
                      ['{service_name=~".+", detected_level="fatal"}']):
        got = ok(call(loki.s, "/loki/api/v1/series", {**window(loki), "match[]": selectors}))
        assert got["status"] == "success"
        want = {fs(e.of(STREAM)) for sel in selectors
                for e in log_query(sel, loki.recs, 0, 2 ** 63, 10 ** 6, "backward")}
        assert len(got["data"]) == len(want) and {fs(x) for x in got["data"]} == want, selectors


def test_a_tenant_without_data_gets_empty_answers(loki):
    t = "empty-tenant"
    empty = {"status": "success", "data": []}
    for path, extra in [("/loki/api/v1/labels", {}), ("/loki/api/v1/label/service_name/values", {}),
                        ("/loki/api/v1/series", {"match[]": '{service_name="auth"}'})]:
        r = call(loki.s, path, {**window(loki), **extra}, tenant=t)
        assert (r.status, r.json) == (200, empty), (path, r.text)
    data = ok(call(loki.s, "/loki/api/v1/query_range",
                   {"query": '{service_name="auth"}', "start": loki.base, "end": loki.end, "limit": 1000},
                   tenant=t))["data"]
    assert data["resultType"] == "streams" and data["result"] == []


def test_tenants_never_see_each_others_logs(loki):
    a, b = loki.tenants["tenant-a"], loki.tenants["tenant-b"]
    for tenant, mine, theirs in (("tenant-a", a, b), ("tenant-b", b, a), (None, loki.recs, a + b)):
        mine_entries = [model_entry(r) for r in mine]
        their_services = {dict(r.resource)["service.name"] for r in theirs}
        # Exact lists are test_labels_list_the_names_the_lines_carry's business; here: nothing of theirs.
        got = set(ok(call(loki.s, "/loki/api/v1/labels", window(loki), tenant=tenant))["data"])
        mine_names = set(names_of(mine_entries))
        their_names = set(names_of([model_entry(r) for r in theirs])) - mine_names
        assert mine_names <= got and not got & their_names, (tenant, sorted(got & their_names))
        got = ok(call(loki.s, "/loki/api/v1/label/service_name/values", window(loki), tenant=tenant))["data"]
        assert got == sorted({e.get("service_name") for e in mine_entries}), tenant
        for svc in their_services:
            sel = f'{{service_name="{svc}"}}'
            data = ok(call(loki.s, "/loki/api/v1/query_range",
                           {"query": sel, "start": loki.base, "end": loki.end, "limit": 1000}, tenant=tenant))["data"]
            assert data["result"] == [], (tenant, svc)
            got = ok(call(loki.s, "/loki/api/v1/series", {**window(loki), "match[]": sel}, tenant=tenant))["data"]
            assert got == [], (tenant, svc)
        got = ok(call(loki.s, "/loki/api/v1/series", {**window(loki), "match[]": '{service_name=~".+"}'},
                      tenant=tenant))["data"]
        assert {fs(x) for x in got} == {fs(e.of(STREAM)) for e in mine_entries}, tenant
    secret = ok(call(loki.s, "/loki/api/v1/label/secret_token/values", window(loki), tenant="tenant-b"))
    assert secret == {"status": "success", "data": []}
    assert ok(call(loki.s, "/loki/api/v1/label/secret_token/values", window(loki), tenant="tenant-a"))["data"] == [
        "s3cr3t"]


# ----------------------------------------------------------------------------------------------
# 5. LogQL queries compared with the evaluator above

FULL = (0, 20 * MIN)
MID = (3 * MIN, 9 * MIN + 500 * MS)
R1 = (0, 20 * MIN, 60_000)
R2 = (17 * S + 250 * MS, 19 * MIN, 45_000)
R3 = (5 * MIN, 15 * MIN, 15_000)
R4 = (0, 20 * MIN, 300_000)
ALL = '{service_name=~".+"}'
TX = TRACE_X.hex()


def log_case(cid, query, win=FULL, direction="backward", limit=1000, categorize=False):
    return pytest.param("log", query, (win, direction, limit, categorize), id=cid)


def range_case(cid, query, r):
    return pytest.param("range", query, r, id=cid)


def instant_case(cid, query, at):
    return pytest.param("instant", query, at, id=cid)


CASES = [
    # Stream selectors.
    log_case("sel-eq", '{service_name="checkout"}'),
    log_case("sel-ne", '{deployment_environment="prod", service_name!="checkout"}'),
    log_case("sel-re", '{service_name=~"ch.*|au.*"}', MID),
    log_case("sel-nre-forward", '{service_name=~".+", k8s_pod_name!~".*-1"}', MID, "forward"),
    log_case("sel-metadata", '{service_name="checkout", detected_level="error"}'),
    log_case("sel-attr-double", '{service_name="auth", elapsed="12.75"}'),
    log_case("sel-backticks", '{service_name=`cart`} |= `timeout`'),
    # Line filters.
    log_case("line-contains", '{service_name="cart"} |= "timeout"'),
    log_case("line-or", '{service_name="cart"} |= "timeout" or "refused"'),
    log_case("line-re-ci", ALL + ' |~ "(?i)error"'),
    log_case("line-re-ci-or", ALL + ' |~ `(?i)TIMEOUT` or `(?i)refused`'),
    log_case("line-not-chain", '{service_name="auth"} != "level=" != "{"'),
    log_case("line-not-re", '{service_name="checkout"} !~ `status=(2|3)\\d\\d`'),
    log_case("line-not-or", '{service_name="cart"} != "timeout" or "refused"'),
    log_case("line-not-re-or", '{service_name="cart"} !~ "time.ut" or "ref.sed"'),
    log_case("line-unicode", ALL + ' |= "café"'),
    log_case("line-limit-forward", ALL + ' |= "GET"', MID, "forward", 25),
    log_case("line-limit-backward", ALL, FULL, "backward", 25),
    # Label filters on attributes and metadata (some pushed into the scan).
    log_case("lf-num-meta", '{service_name="auth"} | severity_number >= 17'),
    log_case("lf-attrs", '{service_name="checkout"} | http_status_code >= 400 | user_id =~ "u-[12]"'),
    log_case("lf-attr-int-str", '{service_name=~".+"} | http_status_code = "503"'),
    log_case("lf-attr-bool", '{service_name="cart"} | retry = "true"'),
    log_case("lf-attr-double", '{service_name="auth"} | elapsed = "2"'),
    log_case("lf-attr-double-num", '{service_name="auth"} | elapsed > 1'),
    log_case("lf-attr-map", '{service_name="checkout"} | http_request_method = "POST"'),
    log_case("lf-level-re", '{service_name="auth"} | detected_level =~ "warn|error|fatal"'),
    log_case("lf-trace", f'{{service_name="auth"}} | trace_id="{TX}"'),
    log_case("lf-trace-upper-case", f'{{service_name="auth"}} | trace_id="{TX.upper()}"'),
    log_case("sel-trace", f'{{service_name="auth", trace_id="{TX}"}}'),
    log_case("lf-non-ascii-attr-name", '{service_name="auth"} | na_ve_flag = "oui"'),
    log_case("lf-user-id-ne", '{service_name="cart"} | user_id != "u-1"'),
    # Parsers.
    log_case("logfmt-num", '{service_name="checkout"} | logfmt | status >= 500'),
    log_case("logfmt-duration", '{service_name="checkout"} | logfmt | latency > 250ms'),
    log_case("logfmt-bytes", '{service_name="checkout"} | logfmt | size > 1KiB'),
    log_case("logfmt-and", '{service_name=~"checkout|cart"} | logfmt | status == 200 and user = "ann"'),
    log_case("logfmt-or", '{service_name="checkout"} | logfmt | status >= 500 or latency > 1s'),
    log_case("logfmt-parens", '{service_name="checkout"} | logfmt | (status >= 500 or status == 404) and user != "ann"'),
    log_case("logfmt-builder-str", '{service_name="checkout"} | logfmt | status = `200`'),
    log_case("logfmt-num-ne", '{service_name="checkout"} | logfmt | status != 200 | status < 500'),
    log_case("logfmt-dotted-key", '{service_name="checkout"} | logfmt | http_method = "GET"'),
    log_case("logfmt-duration-categorized", '{service_name="checkout"} | logfmt | latency > 250ms', categorize=True),
    log_case("logfmt-categorized", '{service_name="checkout"} | logfmt | user = "bob"', categorize=True),
    log_case("json-ok", '{service_name="cart"} | json | __error__=""'),
    log_case("json-ok-categorized", '{service_name="cart"} | json | __error__=""', categorize=True),
    log_case("json-num", '{service_name="cart"} | json | status >= 500'),
    log_case("json-duration", '{service_name="cart"} | json | latency >= 1s'),
    log_case("json-param", '{service_name="cart"} | json user="user.name" | user = "bob"'),
    log_case("json-params-index", '{service_name="cart"} | json tag="tags[1]", who="user.name" | __error__=""'),
    log_case("json-dashed-key", '{service_name="cart"} | json | __error__="" | req_id =~ "r-1.*"'),
    log_case("json-re", '{service_name="cart"} | json | user_name =~ "b.*|d.*"'),
    # Formatting.
    log_case("line-format", '{service_name="cart"} | json | __error__="" | line_format "{{.user_name}} got {{.status}}"'),
    log_case("label-format", '{service_name="checkout"} | logfmt | label_format who=user | who != ""'),
    log_case("label-format-template",
             '{service_name="checkout"} | logfmt | label_format summary="{{.user}}/{{.status}}" | keep service_name, summary'),
    log_case("drop", '{service_name="auth"} | drop detected_level, host_name'),
    log_case("keep", '{service_name="auth"} | keep service_name, detected_level'),
    log_case("drop-matcher", '{service_name="checkout"} | drop level="info", host_name'),
    log_case("keep-matcher", '{service_name="checkout"} | keep service_name, level=~"warn|error"'),
    # Metric queries, range.
    range_case("count-by-service-1m", f"sum by (service_name) (count_over_time({ALL}[1m]))", R1),
    range_case("sparse-windows", f"sum(count_over_time({ALL}[1m]))", R4),
    range_case("bytes-unicode", f'sum by (service_name) (bytes_over_time({ALL} |= "café" [20m]))', R4),
    range_case("count-line-filter", 'sum(count_over_time({service_name="checkout"} |= "timeout" [5m]))', R2),
    range_case("rate-by-level", 'sum by (detected_level) (rate({service_name="cart"}[2m]))', R3),
    range_case("bytes-over-time", f"sum by (service_name) (bytes_over_time({ALL}[5m]))", R4),
    range_case("bytes-rate", 'sum by (k8s_pod_name) (bytes_rate({service_name="checkout"}[1m]))', R2),
    range_case("sum-unwrap", f'sum by (service_name) (sum_over_time({ALL} | logfmt | unwrap status | __error__="" [5m]))', R1),
    range_case("avg-unwrap-duration",
               'avg_over_time({service_name="checkout"} | logfmt | unwrap duration(latency) | __error__="" [5m]) by (k8s_pod_name)', R1),
    range_case("max-unwrap-json", 'max_over_time({service_name="cart"} | json | unwrap size | __error__="" [10m]) by (service_name)', R2),
    range_case("min-unwrap-bytes",
               'min_over_time({service_name=~"checkout|cart"} | logfmt | unwrap bytes(size) | __error__="" [5m]) by (service_name)', R3),
    range_case("count-json-ok", f'sum by (service_name) (count_over_time({ALL} | json | __error__="" [5m]))', R1),
    range_case("quantile",
               'quantile_over_time(0.9, {service_name="checkout"} | logfmt | unwrap duration(latency) | __error__="" [10m]) by (service_name)', R2),
    range_case("stddev",
               'stddev_over_time({service_name="checkout"} | logfmt | unwrap duration(latency) | __error__="" [10m]) by (service_name)', R4),
    range_case("topk", f"topk(2, sum by (k8s_pod_name) (count_over_time({ALL}[5m])))", R1),
    range_case("topk-by", f"topk by (service_name) (1, sum by (service_name, k8s_pod_name) (count_over_time({ALL}[5m])))", R1),
    range_case("bottomk", f"bottomk(1, sum by (service_name) (count_over_time({ALL}[5m])))", R2),
    range_case("div-scalar", f"sum by (service_name) (count_over_time({ALL}[5m])) / 60", R4),
    range_case("cmp-filter", f"sum by (service_name) (count_over_time({ALL}[5m])) > 24", R1),
    range_case("cmp-bool", f"sum by (service_name) (count_over_time({ALL}[5m])) > bool 24", R1),
    range_case("precedence", f"sum by (service_name) (count_over_time({ALL}[5m])) * 2 + 1", R4),
    range_case("vector-ratio",
               f'sum by (service_name) (count_over_time({ALL} |~ "(?i)error" [5m])) / sum by (service_name) (count_over_time({ALL}[5m]))', R1),
    range_case("vector-on",
               f'sum by (service_name) (count_over_time({ALL}[5m])) - on (service_name) sum by (service_name) (count_over_time({ALL} |= "GET" [5m]))', R1),
    range_case("vector-cmp-bool-on",
               f"sum by (service_name) (count_over_time({ALL}[5m])) > bool on (service_name) sum by (service_name) (count_over_time({ALL}[5m] offset 5m))", R1),
    range_case("and", f'sum by (service_name) (count_over_time({ALL}[5m])) and sum by (service_name) (count_over_time({ALL} |= "refused" [5m]))', R1),
    range_case("unless", f'sum by (service_name) (count_over_time({ALL}[5m])) unless sum by (service_name) (count_over_time({ALL} |= "refused" [5m]))', R1),
    range_case("or-vector", 'sum(count_over_time({service_name="auth"} |= "timeout" [1m])) or vector(0)', R1),
    range_case("count-of-pods", f"count(sum by (k8s_pod_name) (count_over_time({ALL}[5m])))", R3),
    range_case("avg-by", f"avg by (deployment_environment) (sum by (deployment_environment, service_name) (count_over_time({ALL}[5m])))", R1),
    range_case("avg-all", f"avg(sum by (service_name) (count_over_time({ALL}[5m])))", R2),
    range_case("max-without", f"max without (k8s_pod_name) (sum by (service_name, k8s_pod_name) (rate({ALL}[5m])))", R2),
    range_case("min-by", f"min by (service_name) (sum by (service_name, k8s_pod_name) (count_over_time({ALL}[3m])))", R3),
    range_case("sum-without", 'sum without (detected_level) (count_over_time({service_name="auth"} | keep service_name, detected_level [5m]))', R1),
    range_case("bare-keep", 'count_over_time({service_name="auth"} | keep service_name, k8s_pod_name [5m])', R4),
    range_case("bare-all-labels", 'count_over_time({service_name="auth"}[5m])', R4),
    range_case("json-num-filter", 'sum(count_over_time({service_name="cart"} | json | status >= 500 [5m]))', R1),
    range_case("by-json-label", 'sum by (user_name) (count_over_time({service_name="cart"} | json | __error__="" [10m]))', R2),
    range_case("by-logfmt-level-collision", 'sum by (level) (count_over_time({service_name="checkout"} | logfmt [5m]))', R1),
    range_case("attr-num-filter", f"sum by (service_name) (count_over_time({ALL} | http_status_code >= 500 [5m]))", R1),
    range_case("unwrap-attr", 'sum(sum_over_time({service_name="checkout"} | unwrap http_status_code | __error__="" [5m]))', R1),
    range_case("unwrap-double", 'sum by (service_name) (avg_over_time({service_name="auth"} | unwrap elapsed | __error__="" [10m]))', R2),
    range_case("line-format-then-filter", 'sum(count_over_time({service_name="checkout"} | logfmt | line_format "{{.user}}" |= "ann" [5m]))', R1),
    range_case("label-format-by", 'sum by (who) (count_over_time({service_name="checkout"} | logfmt | label_format who=user | who != "" [5m]))', R1),
    range_case("bytes-after-line-format", f'sum by (service_name) (bytes_over_time({ALL} | logfmt | line_format "{{{{.status}}}}" [5m]))', R1),
    range_case("grouping-after", f'sum(count_over_time({ALL} |~ "(?i)timeout" [5m])) by (service_name)', R1),
    range_case("builder-no-space", f"sum by(service_name) (count_over_time({ALL}[1m]))", R2),
    range_case("by-map-attr", 'sum by (http_request_method) (count_over_time({service_name="checkout"}[10m]))', R4),
    range_case("by-bool-attr", 'sum by (retry) (count_over_time({service_name="cart"} | retry != "" [20m]))', R4),
    range_case("by-double-attr", 'sum by (elapsed) (count_over_time({service_name="auth"} | elapsed != "" [20m]))', R4),
    range_case("by-scope", f"sum by (scope_name, scope_version) (count_over_time({ALL}[20m]))", R4),
    range_case("rate-unwrap", 'sum(rate({service_name="checkout"} | logfmt | unwrap status | __error__="" [5m]))', R1),
    range_case("last-unwrap", 'sum by (service_name) (last_over_time({service_name=~"checkout|cart"} | logfmt | unwrap status | __error__="" [5m]))', R1),
    range_case("offset", f"sum by (service_name) (count_over_time({ALL}[2m] offset 1m))", R2),
    range_case("duration-filter-no-error", 'sum(count_over_time({service_name="checkout"} | logfmt | latency > 250ms | __error__="" [5m]))', R1),
    range_case("or-filter-no-error",
               'sum(count_over_time({service_name="checkout"} | logfmt | status >= 500 or latency > 1s | __error__="" [5m]))', R3),
    # Samples carrying __error__ fail the query (400 "pipeline error").
    range_case("error-json", 'sum(count_over_time({service_name="cart"} | json [5m]))', R1),
    range_case("error-unwrap", 'sum by (service_name) (sum_over_time({service_name="checkout"} | logfmt | unwrap latency [5m]))', R1),
    range_case("error-label-filter", 'sum(count_over_time({service_name="checkout"} | logfmt | latency > 250ms [5m]))', R1),
    range_case("error-survives-range-grouping",
               'avg_over_time({service_name="checkout"} | logfmt | unwrap duration(latency) [5m]) by (service_name)', R1),
    # Instant queries.
    instant_case("instant-by-service", f"sum by (service_name) (count_over_time({ALL}[10m]))", 7 * MIN + 30 * S + 123 * MS),
    instant_case("instant-boundary", f"sum(count_over_time({ALL}[20m]))", 20 * MIN),
    instant_case("instant-all", f"sum by (detected_level) (count_over_time({ALL}[21m]))", 20 * MIN),
    instant_case("instant-plus-vector", 'sum(count_over_time({service_name="auth"}[5m])) + vector(1)', 12 * MIN),
    instant_case("instant-topk", f"topk(1, sum by (service_name) (bytes_over_time({ALL}[20m])))", 20 * MIN),
]


def test_there_are_at_least_fifty_queries():
    assert len(CASES) >= 50


@pytest.mark.parametrize("kind,query,how", CASES)
def test_logql(loki, kind, query, how):
    if kind == "log":
        (lo, hi), direction, limit, categorize = how
        start, end = loki.base + lo, loki.base + hi
        headers = {"X-Loki-Response-Encoding-Flags": "categorize-labels"} if categorize else {}
        data = ok(call(loki.s, "/loki/api/v1/query_range",
                       {"query": query, "direction": direction, "limit": limit, "start": start, "end": end,
                        "step": "1000ms"}, headers=headers))["data"]
        want = log_query(query, loki.recs, start, end, limit, direction)
        assert_entries_equal(stream_entries(data, categorize, direction), expected_entries(want, categorize))
        return
    if kind == "range":
        lo, hi, step = how
        start, end = loki.base + lo, loki.base + hi
        params = {"query": query, "direction": "backward", "limit": 1000, "start": start, "end": end,
                  "step": f"{step}ms"}
        path, instant = "/loki/api/v1/query_range", False
    else:
        start = end = loki.base + how
        params = {"query": query, "direction": "backward", "limit": 1000, "time": end}
        path, step, instant = "/loki/api/v1/query", 0, True
    try:
        want = metric_query(query, loki.recs, start, end, step, instant)
    except PipelineError as e:
        r = call(loki.s, path, params)
        assert r.status == 400 and "pipeline error" in r.text and str(e) in r.text, (
            f"want 400 pipeline error '{e}', got {r.status}: {r.text[:300]}")
        return
    data = ok(call(loki.s, path, params))["data"]
    got = vector_of(data, end // MS) if instant else matrix_of(data)
    tree = Parser(query).parse()
    if tree[0] == "agg" and tree[1] in ("topk", "bottomk"):
        inner = metric_query(query[query.index(",") + 1:query.rindex(")")], loki.recs, start, end, step, instant)
        assert_topk(got, inner, int(tree[3]), tree[2], tree[1] == "bottomk")
    else:
        assert_series_equal(got, want)
    assert want or got == {}, "the case selects no data"


def test_queries_that_cannot_run_answer_400_naming_the_problem(loki):
    for params, says in [({"query": 'sum_over_time({service_name="auth"}[5m])',
                           "start": loki.base, "end": loki.end, "step": "60000ms"}, "unwrap"),
                         ({"query": '{service_name="auth"}', "time": loki.end}, "instant"),
                         ({"query": 'sum_over_time({service_name="auth"} | unwrap elapsed [5m]) by (k8s_pod_name)',
                           "start": loki.base, "end": loki.end, "step": "60000ms"}, "grouping")]:
        path = "/loki/api/v1/query" if "time" in params else "/loki/api/v1/query_range"
        r = call(loki.s, path, params)
        assert r.status == 400 and says in r.text, (params, r.status, r.text)


# ----------------------------------------------------------------------------------------------
# 6. Shapes Grafana's builder and correlations emit

def test_context_queries_page_around_a_line(loki):
    row = [r for r in loki.recs if dict(r.resource)["k8s.pod.name"] == "checkout-1"][20]
    sel = '{service_name="checkout",k8s_pod_name="checkout-1"}'
    for direction, start, end in (("backward", row.ts - 2 * 60 * MIN, row.ts), ("forward", row.ts, row.ts + 2 * 60 * MIN)):
        data = ok(call(loki.s, "/loki/api/v1/query_range",
                       {"query": sel, "direction": direction, "limit": 10, "start": start, "end": end,
                        "step": "1000ms"}, headers={"X-Query-Tags": "Source=logcontext"}))["data"]
        got = stream_entries(data, False, direction)
        want = log_query(sel, loki.recs, start, end, 10, direction)
        assert len(want) == 10
        assert_entries_equal(got, expected_entries(want, False))
        assert (row.ts in [g[0] for g in got]) == (direction == "forward")


def test_trace_to_logs_finds_the_trace_and_prunes_blocks_by_bloom(loki):
    query = f'{{service_name="auth"}} | trace_id="{TX}"'
    params = {"query": query, "direction": "backward", "limit": 1000, "start": loki.base, "end": loki.end,
              "step": "1000ms"}
    answers = []

    def published():
        answers.append(ok(call(loki.s, "/loki/api/v1/query_range", params))["data"])
        return answers[-1]["stats"]["mira"]["recent_blocks"] == 0

    wait_until("the dataset's blocks to be published", published)
    data = answers[-1]
    got = stream_entries(data, False, "backward")
    want = [r for r in loki.recs if r.trace_id == TRACE_X]
    assert len(want) >= 3 and sorted(g[0] for g in got) == sorted(r.ts for r in want)
    # Once published, a page is kept whole and its repeat reads no block:
    # a query no earlier one asked (another limit) shows the pruning.
    fresh = ok(call(loki.s, "/loki/api/v1/query_range", dict(params, limit=999)))["data"]
    assert stream_entries(fresh, False, "backward") == got
    mira = fresh["stats"]["mira"]
    # The records of the trace went out in one export (at most one block per shard).
    assert mira["blocks_pruned"]["bloom"] >= 1, mira
    assert mira["blocks_fetched"] <= 2 < mira["blocks_considered"], mira


# ----------------------------------------------------------------------------------------------
# 7. Live tail

def tail_messages(ws, deadline):
    """Messages until the deadline (or the socket closes)."""
    while time.time() < deadline:
        try:
            msg = ws.recv(timeout=max(0.05, deadline - time.time()))
        except TimeoutError:
            return
        yield json.loads(msg)


def tail_lines(msg):
    assert set(msg) == {"streams", "dropped_entries"}, msg
    out = []
    for s in msg["streams"]:
        for ts, line in s["values"]:
            assert isinstance(ts, str) and len(ts) == 19 and ts.isdigit(), ts
            out.append((int(ts), line, s["stream"]["service_name"]))
    return out


def test_live_tail_sends_the_backlog_then_every_new_line_once(loki):
    s, tenant = loki.s, "tail"
    now = time.time_ns()
    backlog = small_set(now - 5 * MIN, "tailer", [f"old line {k}" for k in range(5)])
    send(s, backlog, tenant=tenant)
    wait_until("the backlog", lambda: count_of(s, "{service_name=\"tailer\"}", now + MIN, tenant) == 5)
    uri = f"ws://{s.query}/loki/api/v1/tail?" + urllib.parse.urlencode({"query": '{service_name="tailer"} != "skip"'})
    seen = []
    with ws_connect(uri, additional_headers={"X-Scope-OrgID": tenant}, open_timeout=10) as ws:
        first = json.loads(ws.recv(timeout=20))
        assert sorted(tail_lines(first)) == sorted((r.ts, r.body, "tailer") for r in backlog)
        batches = []
        for b in range(2):
            t0 = time.time_ns()
            batch = [Rec(ts=t0 + k * 1000, resource=[("service.name", "tailer")], scope=("", "", []), attrs=[],
                         body=f"new line {b}.{k}" if k % 3 else f"skip line {b}.{k}") for k in range(6)]
            send(s, batch, tenant=tenant)
            batches.append(batch)
            want = {(r.ts, r.body, "tailer") for bt in batches for r in bt if not r.body.startswith("skip")}
            for msg in tail_messages(ws, time.time() + 30):
                seen.extend(tail_lines(msg))
                if want <= set(seen):
                    break
            assert want <= set(seen), f"missing {sorted(want - set(seen))}"
    assert len(seen) == len(set(seen)), f"sent twice: {[x for x in seen if seen.count(x) > 1]}"
    assert not [x for x in seen if x[1].startswith("skip") or x[1].startswith("old")], seen


@pytest.mark.parametrize("query,says", [('{service_name="tailer"', "parse error"),
                                        ('count_over_time({service_name="tailer"}[1m])', "log")])
def test_live_tail_of_a_bad_query_closes_with_1008_and_the_reason(loki, query, says):
    uri = f"ws://{loki.s.query}/loki/api/v1/tail?" + urllib.parse.urlencode({"query": query})
    with ws_connect(uri, open_timeout=10) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=20)
    frame = closed.value.rcvd
    assert frame is not None and frame.code == 1008 and says in frame.reason, frame


# ----------------------------------------------------------------------------------------------
# 8. Hostile input

def raw_request(hostport, target, timeout=30):
    """Sends a GET with a huge target, stops sending once the server answers; the status (or None)."""
    host, port = hostport.rsplit(":", 1)
    data = f"GET {target} HTTP/1.1\r\nHost: mira\r\nConnection: close\r\n\r\n".encode()
    got = b""
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sent = 0
        deadline = time.time() + timeout
        while time.time() < deadline:
            readable, writable, _ = select.select([sock], [sock] if sent < len(data) else [], [], 1)
            if readable:
                try:
                    chunk = sock.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                got += chunk
                if b"\r\n" in got:
                    break
            elif writable:
                try:
                    sent += sock.send(data[sent:sent + 65536])
                except (BrokenPipeError, ConnectionResetError):
                    sent = len(data)
    m = re.match(rb"HTTP/1\.[01] (\d{3})", got)
    return int(m.group(1)) if m else None


def test_hostile_queries_are_refused_and_the_querier_keeps_serving(loki):
    s = loki.s
    day = {"start": loki.end - 24 * 60 * MIN, "end": loki.end}
    deep = "(" * 10_000 + "vector(1)" + ")" * 10_000
    for path, params, says in [
        ("/loki/api/v1/query_range", {"query": '{service_name="checkout"', **day}, ["parse error"]),
        ("/loki/api/v1/query_range", {"query": '{service_name="checkout"}}', **day}, ["parse error"]),
        ("/loki/api/v1/query", {"query": deep, "time": loki.end}, ["deep", "depth", "nest", "recurs", "parenthes"]),
        ("/loki/api/v1/query_range", {"query": '{service_name="checkout"}', "limit": 99_999_999, **day}, ["limit"]),
        ("/loki/api/v1/query_range", {"query": 'sum(count_over_time({service_name="checkout"}[1m]))', "step": "1ms",
                                      **day}, ["step"]),
        ("/loki/api/v1/query_range", {"query": '{service_name="checkout"}', "start": loki.end,
                                      "end": loki.base}, ["start", "reversed"]),
    ]:
        r = call(s, path, params)
        assert r.status == 400, (params["query"][:60], r.status, r.text[:300])
        assert r.ctype.startswith("text/plain") and r.text.strip(), (r.ctype, r.text[:300])
        assert any(w in r.text.lower() for w in says), (params["query"][:60], r.text[:300])
    # A catastrophic regex under RE2 semantics: an answer, not a hang.
    for query in ('{service_name=~"(a*)*b"}', '{service_name=~".+"} |~ "(a*)*b"'):
        data = ok(call(s, "/loki/api/v1/query_range", {"query": query, "limit": 1000, **day}, tenant="bodies"))["data"]
        assert data["result"] == [], query
    # A 10 MB query string is refused before parsing.
    status = raw_request(s.query, "/loki/api/v1/query?query=" + "a" * 10_000_000)
    assert status in (400, 414, 431), status
    assert ok(call(s, HEALTH))["data"]["result"] == HEALTH_RESULT


# ----------------------------------------------------------------------------------------------
# 9. The other endpoints

def test_detected_paths_are_404_so_grafana_falls_back(loki):
    for path in ("/loki/api/v1/detected_labels", "/loki/api/v1/detected_fields",
                 "/loki/api/v1/detected_field/level/values"):
        r = call(loki.s, path, {**window(loki), "query": '{service_name="auth"}'})
        assert r.status == 404, (path, r.status, r.text)


def test_buildinfo_answers_a_version(loki):
    info = ok(call(loki.s, "/loki/api/v1/status/buildinfo"))
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["version"]), info


def test_index_stats_counts_the_selectors_lines(loki):
    sel = '{service_name="auth"}'
    got = ok(call(loki.s, "/loki/api/v1/index/stats", {"query": sel, "start": loki.base, "end": loki.end}))
    assert set(got) == {"streams", "chunks", "entries", "bytes"} and all(isinstance(v, int) for v in got.values())
    entries = log_query(sel, loki.recs, loki.base, loki.end + 1, 10 ** 6, "backward")
    assert got["entries"] == len(entries) == N // 3
    assert got["bytes"] == sum(len(e.line.encode()) for e in entries)
    assert got["streams"] == len({fs(e.of(STREAM)) for e in entries})


def test_index_volume_answers_bytes_per_service(loki):
    got = ok(call(loki.s, "/loki/api/v1/index/volume",
                  {"query": ALL, "start": loki.base - MIN, "end": loki.end + MIN}))
    assert got["status"] == "success" and got["data"]["resultType"] == "vector", got
    volume = {s["metric"].get("service_name"): float(s["value"][1]) for s in got["data"]["result"]}
    assert all(set(s["metric"]) == {"service_name"} for s in got["data"]["result"])
    want = {}
    for e in log_query(ALL, loki.recs, 0, 2 ** 63, 10 ** 6, "backward"):
        want[e.get("service_name")] = want.get(e.get("service_name"), 0) + len(e.line.encode())
    assert volume == want
    values = [float(s["value"][1]) for s in got["data"]["result"]]
    assert values == sorted(values, reverse=True)
