"""The phone-agent workload on one GPU, in one call, next to its compute floor (GPU).

    python scripts/gpu/phone_agent_bench.py [--agents 1,16,64] [--steps 5] [--rounds 1]
        [--modes oa,plain] [--server-args "..."]

Starts our server as the phone-agent issue does (AutoGLM-Phone-9B, random weights,
--max-model-len 25480, max_pixels 5,000,000, ten images a prompt), then runs
`autoglm-serve bench serve --dataset phone-agent` at each agent count: Open-AutoGLM's sampling
(`oa`: frequency_penalty 0.2, top_p 0.85, temperature 0) and greedy without penalties (`plain`),
alternating, --rounds times each. Each run's compute floor comes from the work the server
reports for it (its /metrics before and after: prompt tokens computed past the prefix cache,
images encoded, tokens generated), in FLOPs from the model's config, over the bf16 matmul
peak measured in this call before the server starts. The engine's step log (--log-stats-interval
1) gives the slowest step of every second while requests ran, and its step trace (--step-trace)
every step of a run: time in decode-only steps, in steps carrying prompt chunks or vision
blocks, steps over 40 ms, the time no step ran, and a step's cost fitted to what it carried
(a prompt token, a vision token-equivalent, a decode row). Prints markdown tables; writes JSON to
$OUT/phone_agent_bench.json. --smoke runs the same on a CPU with the embedded default's
shapes replaced by a tiny GLM-4.1V (the check that this script works, not a figure).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import statistics
import subprocess
import sys
import time

import httpx
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from autoglm_serve.bench.server_process import ServerProcess, free_port  # noqa: E402
import model_flops  # noqa: E402

EXTRA = {"oa": '{"frequency_penalty":0.2,"top_p":0.85}', "plain": "{}"}
STEP_LOG = re.compile(r"engine: (\d+) steps \(mean ([\d.]+) ms, slowest ([\d.]+) ms\).*"
                      r"running (\d+), waiting (\d+)")


def matmul_peak_tflops() -> float:
    import torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    return 20 * 2 * 8192 ** 3 / (time.perf_counter() - start) / 1e12


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        name = name.split("{")[0]
        values[name] = values.get(name, 0.0) + float(value)
    return values


def work_flops(cfg: dict, delta: dict[str, float], patches: int) -> float:
    """The run's FLOPs: prefill past the cached prefix, the images encoded, generated tokens
    (attention left out: a floor)."""
    tc, vc = cfg["text_config"], cfg["vision_config"]
    get = lambda name: delta.get(name, 0.0)   # noqa: E731
    computed = get("vllm:prompt_tokens_total") - get("vllm:prefix_cache_hits_total")
    images = get("autoglm:encoder_cache_queries_total") - get("autoglm:encoder_cache_hits_total")
    per_token = model_flops.decoder_flops_per_token(tc)
    return ((computed + get("vllm:generation_tokens_total")) * per_token
            + images * model_flops.vision_flops(vc, patches))


def screenshot_patches(max_pixels: int) -> int:
    from autoglm_serve.multimodal.image_processor import smart_resize
    h, w = smart_resize(2400, 1080, max_pixels=max_pixels)
    return (h // 14) * (w // 14)


def trace_summary(path: str, start: float, end: float) -> dict:
    """The step trace's lines that ended inside [start, end] (engine/step_trace.py), summed."""
    steps = []
    with open(path) as f:
        for line in f:
            step = json.loads(line)
            if start <= step["t"] <= end:
                step.setdefault("encoder_tokens", 0)    # an isolated step's line has none
                steps.append(step)
    if not steps:
        return {}
    step_p50, step_p99, step_max = p50_p99_max([s["ms"] for s in steps])
    decode_only = [s for s in steps if not s["prompt_tokens"] and not s["encoder_tokens"]]
    encoder = [s for s in steps if s["encoder_tokens"]]
    prompt = [s for s in steps if s["prompt_tokens"] and not s["encoder_tokens"]]
    seconds = lambda group: sum(s["ms"] for s in group) / 1e3   # noqa: E731
    return dict(
        steps=len(steps), step_p50_ms=step_p50, step_p99_ms=step_p99, step_max_ms=step_max,
        steps_over_40ms=sum(1 for s in steps if s["ms"] > 40),
        decode_only_s=seconds(decode_only), prompt_s=seconds(prompt), encoder_s=seconds(encoder),
        launch_cpu_s=sum(s.get("launch_cpu_ms", 0.0) for s in steps) / 1e3,
        idle_s=max(0.0, (end - start) - seconds(steps)),
        decode_only_ms_mean=1e3 * seconds(decode_only) / max(1, len(decode_only)),
        decode_rows_mean=statistics.mean(s["decode_rows"] for s in steps),
        prompt_tokens_per_step=statistics.mean(s["prompt_tokens"] for s in steps),
        encoder_tokens_per_step=statistics.mean(s["encoder_tokens"] for s in steps),
        slow_decode_steps=slow_decode_steps(steps), step_cost=step_cost_fit(steps),
        prompt_launches=prompt_launches(steps), slow_launch_stacks=slow_launch_stacks(steps))


def prompt_launches(steps: list[dict]) -> dict:
    """The host's CPU time launching the steps that carry prompt tokens: its median, p99 and
    max, and how many took over 60 ms (a kernel loaded or compiled mid-run, the host
    stalled)."""
    cpu = [s["launch_cpu_ms"] for s in steps
           if s["prompt_tokens"] and s.get("launch_cpu_ms") is not None]
    if not cpu:
        return {}
    p50, p99, most = p50_p99_max(cpu)
    return dict(count=len(cpu), cpu_p50_ms=p50, cpu_p99_ms=p99, cpu_max_ms=most,
                over_60ms=sum(1 for ms in cpu if ms > 60))


def p50_p99_max(values: list[float]) -> tuple[float, float, float]:
    """Nearest-rank median, p99 and max of a non-empty list."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2], ordered[int(0.99 * (len(ordered) - 1))], ordered[-1]


def slow_launch_stacks(steps: list[dict], top: int = 5) -> list[list]:
    """The stacks sampled in slow launches (AUTOGLM_SLOW_LAUNCH_MS, engine/launch_sampler.py),
    summed over the run, most frequent first: [stack, samples, launches]."""
    samples, launches = collections.Counter(), collections.Counter()
    for s in steps:
        for stack, n in (s.get("launch_stacks") or {}).get("stacks", ()):
            samples[stack] += n
            launches[stack] += 1
    return [[stack, n, launches[stack]] for stack, n in samples.most_common(top)]


# a line's wait for the step before it under which the device was idle: the host was the bound
HOST_BOUND_WAIT_MS = 0.5


def step_cost_fit(steps: list[dict]) -> dict | None:
    """A step's device time as a least-squares fit of what it carried: ms = intercept + a
    prompt token x n + a vision token-equivalent (as the encoder priced it) x n + a decode row
    x n. With async scheduling a step's line times its wait for the step before it, so each
    line is fitted against the contents of the line before (steps that ran nothing left out).
    A line that did not wait (under HOST_BOUND_WAIT_MS) timed the host's launch, not the
    device: left out too. vision_over_prompt near 1 says the encoder's price matches the
    device; the intercept is mostly the weights read once a step."""
    rows, ms = [], []
    for before, after in zip(steps, steps[1:]):
        carried = before["decode_rows"] + before["prompt_tokens"] + before["encoder_tokens"]
        wait = after.get("wait_ms")     # None in traces older than the field
        if carried and (wait is None or wait >= HOST_BOUND_WAIT_MS):
            rows.append([1.0, before["prompt_tokens"], before["encoder_tokens"],
                         before["decode_rows"]])
            ms.append(after["ms"])
    if len(rows) < 8:
        return None
    coef = np.linalg.lstsq(np.array(rows), np.array(ms), rcond=None)[0]
    fit = dict(intercept_ms=coef[0], prompt_token_ms=coef[1], vision_token_ms=coef[2],
               decode_row_ms=coef[3])
    fit["vision_over_prompt"] = coef[2] / coef[1] if coef[1] > 0 else None
    return {k: None if v is None else float(v) for k, v in fit.items()}


def slow_decode_steps(steps: list[dict]) -> dict:
    """Steps over 40 ms while requests decode (the issue's target), with the medians of what
    they and the step before them carried: with async scheduling a step's time is mostly its
    wait for the step before it on the device."""
    slow = [i for i, s in enumerate(steps) if s["decode_rows"] and s["ms"] > 40]
    if not slow:
        return {"count": 0}
    median = lambda key, rows: statistics.median(r.get(key) or 0 for r in rows)  # noqa: E731
    this = [steps[i] for i in slow]
    before = [steps[i - 1] for i in slow if i > 0] or this
    fields = ("ms", "encode_ms", "schedule_ms", "launch_ms", "launch_cpu_ms", "wait_ms",
              "decode_rows", "prompt_tokens", "encoder_tokens")
    return dict(count=len(slow), **{f"{k}_median": median(k, this) for k in fields},
                **{f"before_{k}_median": median(k, before)
                   for k in ("ms", "decode_rows", "prompt_tokens", "encoder_tokens")},
                with_encoder=sum(1 for s in this if s["encoder_tokens"]),
                with_device_frees=sum(1 for s in this if s.get("device_frees")),
                with_device_allocs=sum(1 for s in this if s.get("device_allocs")),
                with_host_allocs=sum(1 for s in this if s.get("host_allocs")),
                host_alloc_ms_run=sum(s.get("host_alloc_ms", 0.0) for s in steps),
                device_frees_run=sum(s.get("device_frees", 0) for s in steps),
                alloc_retries_run=sum(s.get("alloc_retries", 0) for s in steps),
                before_with_encoder=sum(1 for s in before if s["encoder_tokens"]))


def run_point(args, server: ServerProcess, agents: int, mode: str, label: str,
              seed: int) -> dict:
    """One bench run. ``seed`` gives it screenshots and tasks no earlier run sent: a repeated
    seed would be served from the encoder and prefix caches of the runs before it."""
    before = scrape(server.base_url)
    log_start = len(server.log(10 ** 9))
    out_dir = os.path.join(args.out, label)
    cmd = [sys.executable, "-m", "autoglm_serve.cli", "bench", "serve",
           "--base-url", server.base_url, "--model", args.model, "--no-progress",
           "--dataset", "phone-agent", "--agents", str(agents), "--steps", str(args.steps),
           "--output-len", str(args.output_len), "--ignore-eos", "--extra-body", EXTRA[mode],
           "--seed", str(seed), "--label", label, "--out", out_dir]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, timeout=args.point_timeout_s)
    after = scrape(server.base_url)
    with open(os.path.join(out_dir, "results.json")) as f:
        result = json.load(f)
    point = result["points"][0]
    # the run as the bench timed it (its steps/s's duration), not the bench process's life,
    # which also renders every screenshot and starts Python: that counted as idle before
    started = result["t0_unix_s"] + point["start_s"]
    ended = result["t0_unix_s"] + point["end_s"]
    summary, agent = point["summary"], point["phone_agent"]
    steps = [m.groups() for m in STEP_LOG.finditer(server.log(10 ** 9)[log_start:])]
    busy = [float(s[2]) for s in steps if int(s[3]) > 0]
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    floor_s = work_flops(args.cfg, delta, args.patches) / (args.peak * 1e12) if args.peak else 0
    return dict(agents=agents, mode=mode, ok=summary["completed"], failed=summary["failed"],
                steps_per_s=agent["agent_steps_per_s"],
                floor_steps_per_s=agent["steps_completed"] / floor_s if floor_s else None,
                ttft_p99_ms=summary["ttft_ms"]["p99"], ttft_median_ms=summary["ttft_ms"]["median"],
                tpot_p99_ms=summary["tpot_ms"]["p99"], tpot_mean_ms=summary["tpot_ms"]["mean"],
                e2e_mean_ms=summary["e2el_ms"]["mean"],
                itl_p99_ms=summary["itl_ms"]["p99"], itl_max_ms=summary["itl_ms"]["max"],
                # what an agent's stream feels of the steps over 40 ms (the trace's "ms" is a
                # step's wait for the one before it, whoever was decoding then)
                itl_over_40ms=sum(1 for rec in point["records"] for gap in rec["itl_ms"]
                                  if gap > 40),
                slowest_step_ms=max(busy, default=None),
                slowest_step_p50_ms=statistics.median(busy) if busy else None,
                gpu_util=(point.get("gpu") or {}).get("util_mean"),
                trace=trace_summary(args.trace_path, started, ended))


def markdown(rows: list[dict], peak: float) -> str:
    lines = [f"bf16 matmul peak this call: {peak:.0f} TFLOP/s", "",
             "| agents | sampling | ok/failed | agent steps/s | floor steps/s | % of floor | "
             "TTFT p50 / p99 ms | TPOT mean / p99 ms | ITL p99 / max ms (gaps > 40 ms) | "
             "step latency ms | slowest step of a second, median / max ms | GPU util |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    fmt = lambda v, p=1: "—" if v is None else f"{v:.{p}f}"   # noqa: E731
    for r in rows:
        share = (100 * r["steps_per_s"] / r["floor_steps_per_s"]
                 if r["floor_steps_per_s"] else None)
        lines.append(
            f"| {r['agents']} | {r['mode']} | {r['ok']}/{r['failed']} | {fmt(r['steps_per_s'], 2)} | "
            f"{fmt(r['floor_steps_per_s'], 2)} | {fmt(share, 0)}% | {fmt(r['ttft_median_ms'], 0)} / "
            f"{fmt(r['ttft_p99_ms'], 0)} | {fmt(r['tpot_mean_ms'])} / {fmt(r['tpot_p99_ms'])} | "
            f"{fmt(r['itl_p99_ms'])} / {fmt(r['itl_max_ms'])} ({r['itl_over_40ms']}) | "
            f"{fmt(r['e2e_mean_ms'], 0)} | {fmt(r['slowest_step_p50_ms'])} / "
            f"{fmt(r['slowest_step_ms'])} | {fmt(r['gpu_util'], 0)} |")
    lines += ["", "Step trace (seconds of the run in each kind of step; idle: no step ran):", "",
              "| agents | sampling | steps | step p50 / p99 / max ms | steps > 40 ms (decoding) | "
              "decode-only s (mean ms) | with prompt chunks s | with vision blocks s | idle s | "
              "decode rows / prompt tokens / vision tokens a step | prompt launches' CPU p50 / "
              "p99 / max ms (over 60 ms) |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        t = r.get("trace") or {}
        if not t:
            continue
        lines.append(
            f"| {r['agents']} | {r['mode']} | {t['steps']} | {t['step_p50_ms']:.1f} / "
            f"{t['step_p99_ms']:.1f} / {t['step_max_ms']:.1f} | {t['steps_over_40ms']} "
            f"({t['slow_decode_steps']['count']}) | {t['decode_only_s']:.2f} ({t['decode_only_ms_mean']:.1f}) | {t['prompt_s']:.2f} | "
            f"{t['encoder_s']:.2f} | {t['idle_s']:.2f} | {t['decode_rows_mean']:.1f} / "
            f"{t['prompt_tokens_per_step']:.0f} / {t['encoder_tokens_per_step']:.0f} | "
            + (f"{p['cpu_p50_ms']:.1f} / {p['cpu_p99_ms']:.1f} / {p['cpu_max_ms']:.1f} "
               f"({p['over_60ms']}) |" if (p := t.get("prompt_launches")) else "- |"))
    fits = [(r, r["trace"]["step_cost"]) for r in rows if (r.get("trace") or {}).get("step_cost")]
    if fits:
        lines += ["", "A step's cost, fitted to the trace (its wait against what the step before "
                  "it carried), ms:", "",
                  "| agents | sampling | intercept | a prompt token | a vision token-eq | "
                  "a decode row | vision / prompt |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for r, f in fits:
            lines.append(f"| {r['agents']} | {r['mode']} | {f['intercept_ms']:.2f} | "
                         f"{f['prompt_token_ms']:.4f} | {f['vision_token_ms']:.4f} | "
                         f"{f['decode_row_ms']:.3f} | {fmt(f['vision_over_prompt'], 2)} |")
    for r in rows:
        stacks = (r.get("trace") or {}).get("slow_launch_stacks")
        if stacks:
            lines += ["", f"Slow launches' stacks, {r['agents']} agents (samples, launches):"]
            lines += [f"- {n}, {k}: {stack}" for stack, n, k in stacks]
    return "\n".join(lines)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", default="1,16,64")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modes", default="oa,plain")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--model", default="autoglm-phone-9b")
    ap.add_argument("--max-pixels", type=int, default=5_000_000)
    ap.add_argument("--server-args", default="", help="more `serve` flags, one string")
    ap.add_argument("--point-timeout-s", type=float, default=240)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU: a tiny GLM-4.1V, 2 agents x 2 steps, no floor")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/phone_agent_bench"))
    return ap.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    args.cfg = model_flops.load_model_config()
    args.patches = screenshot_patches(args.max_pixels)
    serve = [sys.executable, "-m", "autoglm_serve.cli", "serve"]
    if args.smoke:
        from tests.glm4v_fixtures import make_tiny_glm4v
        path = make_tiny_glm4v(os.path.join(args.out, "tiny-glm4v"))
        serve += [str(path), "--max-model-len", "4096", "--mm-processor-kwargs",
                  '{"max_pixels": 200000}']
        args.agents, args.steps, args.output_len, args.peak = "2", 2, 8, 0.0
        args.model = os.path.basename(str(path))
    else:
        args.peak = matmul_peak_tflops()
        serve += [args.model, "--load-format", "dummy", "--max-model-len", "25480",
                  "--mm-processor-kwargs", json.dumps({"max_pixels": args.max_pixels}),
                  "--limit-mm-per-prompt", '{"image":10}']
    port = free_port()
    args.trace_path = os.path.join(args.out, "steps.jsonl")
    serve += ["--served-model-name", args.model, "--host", "127.0.0.1", "--port", str(port),
              "--log-stats-interval", "1", "--step-trace", args.trace_path] \
        + args.server_args.split()
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    server = ServerProcess(serve, port, os.path.join(args.out, "server.log"), env=env,
                           cwd=ROOT).start(timeout_s=600)
    rows = []
    seed = 0
    try:
        for agents in [int(a) for a in str(args.agents).split(",")]:
            for r in range(args.rounds):
                for mode in args.modes.split(","):
                    seed += 1
                    row = run_point(args, server, agents, mode, f"pa{agents}-{mode}-r{r + 1}",
                                    seed)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        server.stop()
    with open(os.path.join(args.out, "phone_agent_bench.json"), "w") as f:
        json.dump(dict(peak_tflops=args.peak, rows=rows, server_args=serve), f, indent=1)
    print(markdown(rows, args.peak))


if __name__ == "__main__":
    main()
