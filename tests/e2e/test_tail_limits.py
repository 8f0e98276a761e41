"""Live tails are queries (issue 29, item 5), on a real `mira serve
--auth tokens` with a limits file and a real WebSocket client: a tail holds
its tenant's query slot for its life (`max_query_concurrency = 1`: the
tenant's next query is 429 until the tail ends), its `start` obeys the
tenant's `max_query_range` (closed 1008 naming it), the querier runs at
most `--max-tails` (the next handshake is 429), a tail without a line to
send is closed after `--tail-idle-timeout` and any tail after
`--tail-max-duration` (1000 and the reason), and a tail whose token is
removed from the tokens file, or expires, is closed with 1008 within the
reload interval. Before, a tail held no slot, saw no range limit, had no
cap and no lifetime, and streamed on after its token was revoked."""

import asyncio
import hashlib
import json
import os
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta, timezone

import websockets
from websockets.exceptions import ConnectionClosed, InvalidStatus

sys.path.insert(0, os.path.dirname(__file__))
from certs import write_atomic  # noqa: E402
from serve_proc import Serve, get_json, wait_until  # noqa: E402

TOKENS = {t: f"tok-{t}-0123456789abcdef" for t in ("acme", "beta", "gamma", "delta")}
LIMITS = '[tenants.acme]\nmax_query_concurrency = 1\nmax_query_range = "1h"\n'


def token_file(names, expires=None):
    text = ""
    for t in names:
        text += (f'[[token]]\nname = "{t}"\nsha256 = "{hashlib.sha256(TOKENS[t].encode()).hexdigest()}"\n'
                 f'tenants = ["{t}"]\nscopes = ["read", "write"]\n')
        if expires and t in expires:
            text += f'expires = "{expires[t]}"\n'
        text += "\n"
    return text.encode()


def auth(tenant):
    return {"Authorization": f"Bearer {TOKENS[tenant]}", "X-Scope-OrgID": tenant}


def tail_uri(serve, service, start_ns=None):
    params = {"query": f'{{service_name="{service}"}}'}
    if start_ns is not None:
        params["start"] = str(start_ns)
    return f"ws://{serve.query}/loki/api/v1/tail?" + urllib.parse.urlencode(params)


def connect(serve, tenant, service, start_ns=None):
    return websockets.connect(tail_uri(serve, service, start_ns), additional_headers=auth(tenant),
                              open_timeout=30)


async def open_tail(serve, tenant, service, start_ns=None):
    """A tail, once there is a place for it under --max-tails (tails this
    test closed give theirs back when the querier sees the close)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return await connect(serve, tenant, service, start_ns)
        except InvalidStatus as e:
            assert e.response.status_code == 429 and time.monotonic() < deadline, e.response.status_code
            await asyncio.sleep(0.05)


async def closed(ws, limit=60):
    """The close frame's (code, reason), reading (and dropping) messages
    until it comes."""
    deadline = time.monotonic() + limit
    while True:
        assert time.monotonic() < deadline, "the tail was not closed"
        try:
            await asyncio.wait_for(ws.recv(), timeout=deadline - time.monotonic())
        except ConnectionClosed as e:
            assert e.rcvd is not None, f"closed without a close frame: {e}"
            return e.rcvd.code, e.rcvd.reason


def post_line(serve, tenant, service, body):
    doc = {"resourceLogs": [{"resource": {"attributes": [
        {"key": "service.name", "value": {"stringValue": service}}]}, "scopeLogs": [{"logRecords": [
            {"timeUnixNano": str(time.time_ns()), "body": {"stringValue": body}}]}]}]}
    req = urllib.request.Request(f"http://{serve.http}/v1/logs", data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **auth(tenant)})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def labels_status(serve, tenant):
    return get_json(f"http://{serve.query}/loki/api/v1/labels", auth(tenant))[0]


def test_tails_hold_slots_obey_limits_end_and_follow_their_token(tmp_path):
    tokens, limits = tmp_path / "tokens.toml", tmp_path / "limits.toml"
    write_atomic(str(tokens), token_file(TOKENS))
    write_atomic(str(limits), LIMITS.encode())
    serve = Serve("--auth", "tokens", "--auth-tokens-file", str(tokens), "--limits-file", str(limits),
                  "--reload-interval", "1s", "--max-tails", "2", "--tail-max-duration", "8s",
                  "--tail-idle-timeout", "5s", "--seal-age", "1s")
    try:
        asyncio.run(phases(serve, tokens))
    finally:
        serve.stop()


async def phases(serve, tokens):
    now = time.time_ns()

    # --max-tails 2: a third tail's handshake is 429 naming the flag.
    async with connect(serve, "beta", "b1"), connect(serve, "beta", "b2"):
        try:
            async with connect(serve, "beta", "b3"):
                raise AssertionError("a third tail was accepted")
        except InvalidStatus as e:
            assert e.response.status_code == 429, e.response.status_code
            assert b"--max-tails" in e.response.body, e.response.body

    # A tail holds acme's only query slot: its other queries are 429
    # while it runs, and 200 once it is closed.
    async with await open_tail(serve, "acme", "quiet-acme", now - 30 * 60 * 10**9):
        wait_until("acme's query refused", lambda: labels_status(serve, "acme") == 429, timeout=30)
    wait_until("acme's slot back", lambda: labels_status(serve, "acme") == 200)

    # max_query_range 1h: a tail from two hours back is closed naming it.
    async with await open_tail(serve, "acme", "quiet-acme", now - 2 * 3600 * 10**9) as ws:
        code, reason = await closed(ws)
        assert code == 1008 and "max_query_range" in reason, (code, reason)
    wait_until("acme's slot back", lambda: labels_status(serve, "acme") == 200)

    # --tail-idle-timeout 5s: a tail with nothing to send is closed.
    async with await open_tail(serve, "acme", "quiet-acme") as ws:
        code, reason = await closed(ws)
        assert code == 1000 and "--tail-idle-timeout" in reason, (code, reason)

    # --tail-max-duration 8s: a tail that keeps sending is closed anyway.
    async with await open_tail(serve, "beta", "busy") as ws:
        async def feed():
            k = 0
            while True:
                await asyncio.to_thread(post_line, serve, "beta", "busy", f"line {k}")
                k += 1
                await asyncio.sleep(0.5)
        feeder = asyncio.create_task(feed())
        try:
            code, reason = await closed(ws)
        finally:
            feeder.cancel()
        assert code == 1000 and "reached tail max duration limit" in reason, (code, reason)

    # Revoked (the tokens file loses delta's token) and expired (gamma's
    # token gets an expiry 2 s ahead): both tails are closed with 1008.
    async with await open_tail(serve, "delta", "d") as d, await open_tail(serve, "gamma", "g") as g:
        soon = (datetime.now(timezone.utc) + timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
        write_atomic(str(tokens), token_file(["acme", "beta", "gamma"], expires={"gamma": soon}))
        for ws in (d, g):
            code, reason = await closed(ws, limit=30)
            assert code == 1008 and "credential no longer holds" in reason, (code, reason)
