"""/dashboard in a real headless Chromium (Debian's chromium + chromium-driver, installed by
scripts/setup.sh) against the real server on the embedded default: the page loads, its charts
update while a load runs, and it reaches nothing but its own server. /dashboard/data is the
registry's samples, the same numbers /metrics serves."""
from __future__ import annotations

import json
import os
import re
import shutil
import threading
import time
from pathlib import Path

import httpx

from tests.server_fixtures import parse_metrics

SCREENSHOT_ENV = "AUTOGLM_DASHBOARD_SCREENSHOT"   # also save the screenshot there


def test_data_is_the_prometheus_samples(embedded_server):
    snap = httpx.get(embedded_server.url("/dashboard/data"), timeout=10).json()
    served = parse_metrics(httpx.get(embedded_server.url("/metrics"), timeout=10).text)
    names = {k.split("{")[0] for k in served}
    assert snap["model"] == "SmolLM2-135M-Instruct" and snap["gpus"] == []   # a CPU server
    for name in ("vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:prefix_cache_queries_total"):
        assert name in snap["values"] and name in names
    assert set(snap["values"]) <= names
    for family in ("vllm:time_to_first_token_seconds",
                   "vllm:request_time_per_output_token_seconds"):
        h = snap["histograms"][family]
        assert f"{family}_bucket" in names and h["le"][-1] is None   # +Inf last
        assert h["cumulative"] == sorted(h["cumulative"])


def _browser(tmp_path: Path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "no chromium / chromedriver: run scripts/setup.sh"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1500,1000", "--no-first-run", "--disable-sync",
                "--disable-background-networking", "--disable-component-update",
                "--disable-default-apps", f"--user-data-dir={tmp_path / 'profile'}",
                # nothing but the local server resolves: a CDN or tracker would fail to load
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(executable_path=driver))


def _load(server, stop: threading.Event, finished: list[int]):
    body = {"model": "SmolLM2-135M-Instruct", "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "Name three colours."}]}
    with httpx.Client(timeout=120) as client:
        while not stop.is_set():
            r = client.post(server.url("/v1/chat/completions"), json=body)
            assert r.status_code == 200, r.text
            finished.append(r.json()["usage"]["completion_tokens"])


def _chart(driver, chart_id: str) -> tuple[int, list]:
    el = driver.find_element("id", chart_id)
    last = el.get_attribute("data-last")
    return int(el.get_attribute("data-points") or 0), json.loads(last) if last else []


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def test_dashboard_updates_under_load_and_stays_local(embedded_server, tmp_path):
    driver = _browser(tmp_path)
    stop, finished = threading.Event(), []
    workers = [threading.Thread(target=_load, args=(embedded_server, stop, finished))
               for _ in range(3)]
    try:
        driver.get(embedded_server.url("/dashboard"))
        body = driver.find_element("tag name", "body")
        _wait(lambda: int(body.get_attribute("data-polls")) >= 2, 30, "two polls")
        points_before, _ = _chart(driver, "throughput")
        for w in workers:
            w.start()
        seen = {"running": False, "generation": False}

        def busy():
            _, req = _chart(driver, "requests")
            _, tput = _chart(driver, "throughput")
            seen["running"] |= bool(req and req[0] and req[0] > 0)
            seen["generation"] |= bool(tput and tput[1] and tput[1] > 0)
            return all(seen.values())
        _wait(busy, 90, "running requests and generation tok/s on the charts")
        # the percentiles fill as requests finish within the last minute
        _wait(lambda: _chart(driver, "ttft")[1][0] is not None and
              _chart(driver, "tpot")[1][0] is not None, 60, "TTFT and TPOT percentiles")
        time.sleep(1.5)   # one more poll, so the shot shows the lines drawn
        shot = tmp_path / "dashboard.png"
        driver.save_screenshot(str(shot))
        if os.environ.get(SCREENSHOT_ENV):
            shutil.copy(shot, os.environ[SCREENSHOT_ENV])
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000

        points_after, (prompt_tps, gen_tps) = _chart(driver, "throughput")
        assert points_after > points_before
        ttft_ms = _chart(driver, "ttft")[1]
        assert 0 < ttft_ms[0] <= ttft_ms[1] <= ttft_ms[2]
        kv_points, (kv,) = _chart(driver, "kv-cache")
        assert kv_points > 2 and 0 <= kv <= 100
        prefix, encoder = _chart(driver, "cache-hits")[1]
        assert prefix is not None and 0 <= prefix <= 100 and encoder is None   # no vision model
        for gpu_chart in ("gpu-util", "gpu-memory", "gpu-power"):
            el = driver.find_element("id", gpu_chart)
            assert el.get_attribute("data-state") == "no-gpu" and "no GPU" in el.text
        assert body.get_attribute("data-failures") == "0"

        # nothing but the server itself was asked for, and the page names no other host
        origin = embedded_server.base_url
        urls = driver.execute_script(
            "return performance.getEntries().map(e => e.name).filter(n => n.includes('://'))")
        assert urls and all(u.startswith(origin) for u in urls), urls
        outside = [u for u in re.findall(r"\b(?:https?|wss?)://[^\s\"'<>)]+", driver.page_source)
                   if not u.startswith(origin)]
        assert not outside, outside
    finally:
        stop.set()
        for w in workers:
            if w.ident:
                w.join(timeout=120)
        driver.quit()
    assert finished and all(0 < n <= 24 for n in finished)
