#!/usr/bin/env python
"""Soak: minutes of mixed loopback traffic, then a check that the server came back to rest.

    python scripts/soak.py --minutes 3                  # starts the embedded default itself
    python scripts/soak.py --base-url http://127.0.0.1:8000 --pid 1234 --minutes 10

Traffic, from --concurrency workers: good chat and completions requests, streamed ones (read to
[DONE]), streams the client abandons after a chunk or two, and hostile bodies that must be a 4xx
(seed 2**64, n 100000, temperature Infinity, a lone surrogate, an oversized max_tokens,
malformed JSON). Prints a JSON report: requests by class and status, errors by class, 5xx,
running requests and KV usage before and after (/metrics), the server's RSS before and after,
the load average. Exit status 1 on any 5xx, any error, requests or KV not back to 0 within
10 s, or RSS growth over --max-rss-growth-mb (on a CPU server, plus its KV cache's size: those
pages become resident as blocks are first written).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from autoglm_serve.bench.server_process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
CHAT, COMP = "/v1/chat/completions", "/v1/completions"
SERVER_ARGS = ["--max-model-len", "512", "--kv-cache-memory-gib", "0.25", "--max-num-seqs", "4"]
TOPICS = ["cats", "the moon", "bread", "rivers", "chess", "tea", "owls", "maps", "bees"]
SETTLE_S = 10.0
MSG = '[{"role": "user", "content": "hi"}]'
# (name, path, raw body, expected status): each once stopped the engine, queued forever or
# was served wrongly (issue 16 and tests/test_server_errors.py).
HOSTILE = [
    ("seed_2_64", CHAT, f'{{"messages": {MSG}, "max_tokens": 2, "seed": {2**64}}}', 400),
    ("n_100000", CHAT, f'{{"messages": {MSG}, "max_tokens": 2, "n": 100000}}', 400),
    ("temperature_infinity", CHAT, f'{{"messages": {MSG}, "temperature": Infinity}}', 400),
    ("lone_surrogate", CHAT, '{"messages": [{"role": "user", "content": "a\\ud800"}]}', 400),
    ("max_tokens_oversized", COMP, '{"prompt": "hi", "max_tokens": 1000000}', 400),
    ("malformed_json", CHAT, '{"messages": [', 400),
    ("penalty_bool", CHAT, f'{{"messages": {MSG}, "presence_penalty": false}}', 400),
]


# ---- the server's side: metrics and memory ------------------------------------------------
def read_metrics(client: httpx.Client) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for line in client.get("/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            if 'finished_reason="abort"' in name:
                out["aborted"] += float(value)
            if name.startswith("vllm:cache_config_info") and 'device="cpu"' in name:
                out["cpu"] = 1.0
            out[name.split("{", 1)[0]] += float(value)   # summed over labels
    return {k: out.get(k, 0.0) for k in ("vllm:num_requests_running",
                                         "vllm:num_requests_waiting",
                                         "vllm:kv_cache_usage_perc",
                                         "vllm:request_success_total", "aborted",
                                         "autoglm:kv_cache_bytes", "cpu")}


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            pass
    return kids


def rss_mb(pid: int | None) -> dict[str, float] | None:
    """The server's RSS and that of its process tree (the engine core may be a child)."""
    if pid is None:
        return None
    try:
        import psutil
        proc = psutil.Process(pid)
        procs = [proc] + proc.children(recursive=True)
        sizes = []
        for p in procs:
            try:
                sizes.append(p.memory_info().rss)
            except psutil.NoSuchProcess:
                pass
        return {"server": round(sizes[0] / 2**20, 1), "tree": round(sum(sizes) / 2**20, 1)}
    except ImportError:
        pass
    sizes, todo = [], [pid]
    while todo:   # /proc's VmRSS where psutil is not installed
        p = todo.pop()
        try:
            line = next(x for x in Path(f"/proc/{p}/status").read_text().splitlines()
                        if x.startswith("VmRSS:"))
            sizes.append(int(line.split()[1]) * 1024)
        except (OSError, StopIteration):
            continue
        todo += _children(p)
    return {"server": round(sizes[0] / 2**20, 1), "tree": round(sum(sizes) / 2**20, 1)} \
        if sizes else None


def listening_pid(port: int) -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN:
                return c.pid
    except psutil.AccessDenied:
        pass
    return None


def start_server(extra: list[str]) -> ServerProcess:
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="autoglm-soak-", suffix=".log")[1])
    cmd = [sys.executable, "-m", "autoglm_serve.cli", "serve", *SERVER_ARGS, *extra,
           "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    try:
        return ServerProcess(cmd, port, log, env=env, cwd=ROOT).start(600)
    except RuntimeError as exc:
        raise SystemExit(str(exc)) from None


# ---- the traffic ----------------------------------------------------------------------------
class Tally:
    def __init__(self):
        self.requests: dict[str, Counter] = defaultdict(Counter)
        self.errors: Counter = Counter()
        self.samples: list[str] = []
        self.latency: dict[str, list[float]] = defaultdict(list)

    def record(self, cls: str, status: int | str, ok: bool, seconds: float, why: str = ""):
        self.requests[cls][str(status)] += 1
        self.latency[cls].append(seconds)
        if not ok:
            self.errors[cls] += 1
            if len(self.samples) < 20:
                self.samples.append(f"{cls}: {status} {why[:300]}")


def _good_body(rng: random.Random, chat: bool) -> dict:
    topic = rng.choice(TOPICS)
    body = {"max_tokens": rng.randint(1, 16), "temperature": rng.choice([0.0, 0.7, 1.0]),
            "n": rng.choice([1, 1, 1, 2])}
    if chat:
        body["messages"] = [{"role": "user", "content": f"Tell me about {topic}."}]
    else:
        body["prompt"] = f"Three facts about {topic}:"
    return body


async def _sse(r: httpx.Response, chunks: int | None) -> tuple[bool, str]:
    """Reads events; with `chunks`, stops after that many (the caller then walks away)."""
    seen = 0
    async for line in r.aiter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:]
        if data == "[DONE]":
            return True, ""
        if '"error"' in data and json.loads(data).get("error"):
            return False, data
        seen += 1
        if chunks is not None and seen >= chunks:
            return True, ""
    return chunks is not None, "stream ended without [DONE]"


async def one_request(client: httpx.AsyncClient, rng: random.Random, tally: Tally) -> None:
    kind = rng.choices(["chat", "completion", "chat_stream", "completion_stream",
                        "stream_abandoned", "hostile"], weights=[3, 2, 3, 2, 2, 3])[0]
    t0 = time.monotonic()
    try:
        if kind == "hostile":
            name, path, raw, want = rng.choice(HOSTILE)
            r = await client.post(path, content=raw.encode(),
                                  headers={"content-type": "application/json"})
            err = r.json().get("error") if r.headers.get("content-type", "").startswith(
                "application/json") else None
            ok = r.status_code == want and isinstance(err, dict) and err.get("message")
            tally.record(f"hostile:{name}", r.status_code, bool(ok), time.monotonic() - t0,
                         r.text)
        elif kind in ("chat", "completion"):
            r = await client.post(CHAT if kind == "chat" else COMP,
                                  json=_good_body(rng, kind == "chat"))
            ok = r.status_code == 200 and bool(r.json().get("choices"))
            tally.record(kind, r.status_code, ok, time.monotonic() - t0, r.text)
        else:
            chat = kind != "completion_stream"
            body = {**_good_body(rng, chat), "stream": True}
            if kind == "stream_abandoned":   # long enough to still be running when we leave
                body.update(max_tokens=200, ignore_eos=True, n=1)
            async with client.stream("POST", CHAT if chat else COMP, json=body) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")
                    tally.record(kind, r.status_code, False, time.monotonic() - t0, text)
                    return
                ok, why = await _sse(r, rng.randint(1, 3) if kind == "stream_abandoned"
                                     else None)
            # Leaving the `async with` unread closes the connection: the server sees the
            # client go and must abort the request.
            tally.record(kind, 200, ok, time.monotonic() - t0, why)
    except httpx.HTTPError as exc:
        tally.record(kind, type(exc).__name__, False, time.monotonic() - t0, repr(exc))


async def traffic(base_url: str, headers: dict, seconds: float, concurrency: int,
                  max_requests: int, seed: int) -> Tally:
    tally = Tally()
    deadline = time.monotonic() + seconds
    budget = [max_requests]

    async def worker(i: int):
        rng = random.Random(seed * 1000 + i)
        async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=120) as client:
            while time.monotonic() < deadline and budget[0] > 0:
                budget[0] -= 1
                await one_request(client, rng, tally)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return tally


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def settle(client: httpx.Client) -> tuple[dict[str, float], float]:
    """Waits until nothing runs and the KV cache is empty; the last reading and the wait."""
    t0 = time.monotonic()
    while True:
        m = read_metrics(client)
        if m["vllm:num_requests_running"] == 0 and m["vllm:kv_cache_usage_perc"] == 0:
            return m, round(time.monotonic() - t0, 2)
        if time.monotonic() - t0 > SETTLE_S:
            return m, round(time.monotonic() - t0, 2)
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", help="a running server (loopback only); default: start one")
    ap.add_argument("--pid", type=int, help="the running server's pid, for its RSS "
                    "(default: the process listening on --base-url's port, through psutil)")
    ap.add_argument("--api-key")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--max-requests", type=int, default=100_000, help="stop after this many")
    ap.add_argument("--max-rss-growth-mb", type=float, default=200.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument for the server this script starts (repeatable)")
    args = ap.parse_args(argv)

    server = log = None
    if args.base_url:
        base_url = args.base_url.rstrip("/")
        parts = urlsplit(base_url)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            ap.error("--base-url must be a loopback address: the soak sends hostile traffic")
        pid = args.pid or listening_pid(parts.port or 80)
    else:
        server = start_server(args.server_arg)
        base_url, pid, log = server.base_url, server.proc.pid, server.log_path
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        with httpx.Client(base_url=base_url, headers=headers, timeout=120) as client:
            # One of each good kind first, so lazily built state is not counted as growth.
            for body in (_good_body(random.Random(0), True), _good_body(random.Random(0), False)):
                client.post(CHAT if "messages" in body else COMP, json=body).raise_for_status()
            before = {"metrics": read_metrics(client), "rss_mb": rss_mb(pid),
                      "loadavg": os.getloadavg()}
            t0 = time.monotonic()
            tally = asyncio.run(traffic(base_url, headers, args.minutes * 60, args.concurrency,
                                        args.max_requests, args.seed))
            duration = time.monotonic() - t0
            metrics_after, settle_s = settle(client)
            healthy = client.get("/health").status_code == 200
            after = {"metrics": metrics_after, "rss_mb": rss_mb(pid),
                     "loadavg": os.getloadavg()}
    finally:
        if server is not None:
            server.stop()

    fives = sum(n for c in tally.requests.values() for s, n in c.items()
                if s.isdigit() and int(s) >= 500)
    growth = None
    if before["rss_mb"] and after["rss_mb"]:
        growth = round(after["rss_mb"]["tree"] - before["rss_mb"]["tree"], 1)
    # A CPU server's KV cache takes its pages as blocks are first written (and the prefix
    # cache rotates through every block before reusing one): growth up to its size is not a
    # leak; a second soak against the same server starts with them resident.
    kv_mb = round(before["metrics"]["autoglm:kv_cache_bytes"] / 2**20, 1) \
        if before["metrics"]["cpu"] else 0.0
    failures = []
    if fives:
        failures.append(f"{fives} responses were 5xx")
    if tally.errors:
        failures.append(f"{sum(tally.errors.values())} requests went wrong")
    if metrics_after["vllm:num_requests_running"] or metrics_after["vllm:kv_cache_usage_perc"]:
        failures.append(f"leak: running requests or KV usage not back to 0 after {SETTLE_S} s")
    if growth is not None and growth > args.max_rss_growth_mb + kv_mb:
        failures.append(f"rss grew {growth} MiB, over --max-rss-growth-mb "
                        f"{args.max_rss_growth_mb}" + (f" plus the {kv_mb} MiB KV cache's pages"
                                                       if kv_mb else ""))
    if not healthy:
        failures.append("/health is not 200 after the soak")
    report = {
        "base_url": base_url, "duration_s": round(duration, 1), "concurrency": args.concurrency,
        "seed": args.seed, "total_requests": sum(sum(c.values()) for c in tally.requests.values()),
        "requests": {k: dict(v) for k, v in sorted(tally.requests.items())},
        "latency_s": {k: {"p50": _pct(v, 0.5), "p99": _pct(v, 0.99)}
                      for k, v in sorted(tally.latency.items())},
        "errors": dict(tally.errors), "error_samples": tally.samples, "server_errors_5xx": fives,
        "before": before, "after": after, "settle_s": settle_s, "rss_growth_mb": growth,
        "kv_cache_pages_allowed_mb": kv_mb,
        "healthy_after": healthy, "server_log": str(log) if log else None,
        "ok": not failures, "failures": failures,
    }
    print(json.dumps(report, indent=2))
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
