"""scripts/soak.py at CI size: 25 s of mixed traffic against a real server, which must come
back to rest (no 5xx, nothing running, KV empty); and its exit status does report a breach."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.server_fixtures import ROOT, server_fixture

SOAK = [sys.executable, str(ROOT / "scripts" / "soak.py")]


@pytest.fixture(scope="module")
def server():
    yield from server_fixture(["--max-model-len", "512", "--kv-cache-memory-gib", "0.25",
                               "--max-num-seqs", "4"])


def soak(server, *args: str) -> tuple[int, dict]:
    r = subprocess.run(SOAK + ["--base-url", server.base_url, "--pid", str(server.proc.pid),
                               *args], capture_output=True, text=True, timeout=300)
    assert r.stdout, r.stderr
    return r.returncode, json.loads(r.stdout)


def test_soak_comes_back_to_rest(server):
    code, report = soak(server, "--minutes", str(25 / 60), "--concurrency", "3")
    assert code == 0, report["failures"]
    assert report["ok"] and report["failures"] == [] and report["errors"] == {}
    assert report["server_errors_5xx"] == 0
    requests = report["requests"]
    for cls in ("chat", "chat_stream", "stream_abandoned"):
        assert requests.get(cls, {}).get("200"), (cls, requests)
    hostile = {k: v for k, v in requests.items() if k.startswith("hostile:")}
    assert hostile and all(set(v) == {"400"} for v in hostile.values()), hostile
    after, before = report["after"], report["before"]
    assert after["metrics"]["vllm:num_requests_running"] == 0
    assert after["metrics"]["vllm:kv_cache_usage_perc"] == 0
    # Abandoned streams were aborted in the engine, not left to run to max_tokens.
    assert after["metrics"]["aborted"] - before["metrics"]["aborted"] >= 1
    assert before["rss_mb"]["tree"] > 0 and report["rss_growth_mb"] is not None
    # the CPU server's 0.25 GiB KV cache (whole blocks of it), whose pages fill as it is used
    assert 250 < report["kv_cache_pages_allowed_mb"] <= 256
    assert len(after["loadavg"]) == 3 and report["healthy_after"]


def test_soak_exit_status_reports_a_breach(server):
    """A growth bound of -1 TiB, which any RSS exceeds, must fail the run."""
    code, report = soak(server, "--minutes", str(3 / 60), "--concurrency", "1",
                        "--max-rss-growth-mb", str(-2**20))
    assert code == 1 and not report["ok"]
    assert any("rss grew" in f for f in report["failures"]), report["failures"]
