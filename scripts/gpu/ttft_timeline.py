"""Where one phone agent's time to first token goes: the server's steps beside each request.

    python3 scripts/gpu/ttft_timeline.py [--steps 8] [--server-args "..."]
    python3 scripts/gpu/ttft_timeline.py --smoke     # CPU, a tiny GLM-4.1V (checks the script)

Starts the server as scripts/gpu/phone_agent_bench.py does (AutoGLM-Phone-9B, random weights,
--step-trace), then sends one agent's episode, step after step (Open-AutoGLM's sampling, 128
tokens, --ignore-eos; with --logprobs also logprobs, so that each token comes in a chunk even
while the detokenizer holds its bytes, at the price of a log-softmax over the vocabulary every
decode step), with wall-clock times. The TTFT runs to the first token's chunk.
The trace's steps that ended between the send and then split it into four parts that add up to
it: before the first step that did the request's work (HTTP, image decoding and hashing,
tokenization, the hop to the core); the steps running its vision blocks and those computing its
prompt, each until the device finished it (with async scheduling, at the next step's line,
which waited for it); and after the step that sampled the first token finished (its way back to
the client). "Text held" is the first token's chunk to the first text: bytes that end
mid-character wait in the detokenizer, many with the stand-in byte-level tokenizer of random
weights, few with a real one. Two more columns come from the server's own histograms
(/dashboard/data): "to the engine", the client's TTFT less the server's (the client's send to
the request's arrival at the engine, its image and prompt prepared, plus the first token's way
back), and "queue", arrival to first scheduled (the hop to the core, and the launch of the
vision tower, which comes before the step schedules the prompt; on a CPU, the tower's run).
Also times the server's image loading alone (multimodal/media.py) on this host's CPU. Prints a
table, writes $OUT/ttft_timeline.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

import httpx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from autoglm_serve.bench.phone_agent import PhoneEpisode, TASKS  # noqa: E402
from autoglm_serve.bench.screenshots import screenshot_png_base64  # noqa: E402
from autoglm_serve.bench.server_process import ServerProcess, free_port  # noqa: E402


async def send(client: httpx.AsyncClient, base: str, model: str, messages, max_tokens: int,
               logprobs: bool):
    """(sent, first token, first text, end, text). With logprobs every token comes in a chunk
    of its own: the detokenizer holds bytes that end mid-character (the smoke's byte-level
    tokenizer makes many; --load-format dummy's stand-in mostly samples whole fillers)."""
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "top_p": 0.85, "frequency_penalty": 0.2, "ignore_eos": True,
            "logprobs": logprobs}
    sent = time.time()
    first = first_text = None
    text = []
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:2000]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choices = json.loads(line[6:])["choices"]
            if not choices:
                continue
            if choices[0].get("logprobs") or choices[0]["delta"].get("content"):
                first = first or time.time()
            if choices[0]["delta"].get("content"):
                first_text = first_text or time.time()
                text.append(choices[0]["delta"]["content"])
    return sent, first, first_text, time.time(), "".join(text)


SERVER_HISTOGRAMS = {"server_ttft_ms": "vllm:time_to_first_token_seconds",
                     "queue_ms": "vllm:request_queue_time_seconds"}


async def server_sums(client: httpx.AsyncClient, base: str) -> dict:
    """{key: (count, sum in ms)} of SERVER_HISTOGRAMS, from the server's /dashboard/data (its
    metrics registry with each histogram summed over its labels, server/dashboard.py)."""
    histograms = (await client.get(base + "/dashboard/data")).json()["histograms"]
    return {key: (histograms[name]["count"], 1e3 * histograms[name]["sum"])
            for key, name in SERVER_HISTOGRAMS.items()}


async def server_times(client: httpx.AsyncClient, base: str, before: dict) -> dict:
    """One finished request's server-side TTFT (from the request's arrival at the engine, once
    its prompt and image are prepared, to its first token's output in the server) and queue
    time (arrival to first scheduled: the hop to the core and any wait), from the histograms'
    change; the request's metrics land as it finishes, so this waits for the count to move."""
    for _ in range(100):
        after = await server_sums(client, base)
        if all(after[k][0] > before[k][0] for k in SERVER_HISTOGRAMS):
            return {k: after[k][1] - before[k][1] for k in SERVER_HISTOGRAMS}
        await asyncio.sleep(0.01)
    return {}


def attribute(steps: list[dict], sent: float, first: float) -> dict:
    """The request's TTFT in parts that add up to it, from the steps that ended inside
    (sent, first]. A step's work is done when its line is written if it synced, else (async
    scheduling: its line is written once it is launched) when the next line is, which waited
    for it on the device. Each work step is charged the wall time from the completion of the
    one before it (the first: from its own start) to its own completion."""
    mine = [s for s in steps if sent < s["t"] <= first]
    work = [i for i, s in enumerate(mine) if s.get("encoder_tokens") or s["prompt_tokens"]]
    if not work:
        return {"steps": len(mine)}

    def completed(i: int) -> float | None:
        if mine[i].get("sync_ms") is not None or "sync_ms" not in mine[i]:
            return mine[i]["t"]
        return mine[i + 1]["t"] if i + 1 < len(mine) else None

    if completed(work[-1]) is None:
        return {"steps": len(mine)}     # the trace lacks the line that completed it
    begin = mine[work[0]]["t"] - mine[work[0]]["ms"] / 1e3
    parts = {"vision_ms": 0.0, "prompt_ms": 0.0}
    done = begin
    for i in work:
        end = completed(i)
        parts["vision_ms" if mine[i].get("encoder_tokens") else "prompt_ms"] += 1e3 * (end - done)
        done = end
    chosen = [mine[i] for i in work]
    return dict(
        ttft_ms=1e3 * (first - sent), before_ms=1e3 * (begin - sent), **parts,
        after_ms=1e3 * (first - done), steps=len(mine), work_steps=len(work),
        prompt_tokens=sum(s["prompt_tokens"] for s in chosen),
        encoder_tokens=sum(s.get("encoder_tokens", 0) for s in chosen),
        launch_ms=sum(s.get("launch_ms", 0) for s in chosen),
        encode_ms=sum(s.get("encode_ms", 0) for s in chosen),
        wait_ms=sum(s.get("wait_ms", 0) for s in chosen),
        sync_ms=sum(s.get("sync_ms") or 0 for s in chosen))


def print_decode_steps(steps: list[dict], times: list, max_tokens: int) -> None:
    """The episode's decode-only steps against the client's time per output token: where the
    core's loop (schedule, launch, wait for the device, the gap to the next step) goes."""
    inside = [s for s in steps if any(first < s["t"] <= end for _, first, _, end, _ in times)]
    decode = [s for s in inside if s["decode_rows"] and not s["prompt_tokens"]
              and not s.get("encoder_tokens")]
    if len(decode) < 2:
        return
    gaps = [1e3 * (b["t"] - a["t"]) for a, b in zip(decode, decode[1:]) if b["t"] - a["t"] < 0.05]
    med = {k: statistics.median(s.get(k) or 0 for s in decode)
           for k in ("ms", "schedule_ms", "launch_ms", "wait_ms")}
    print(f"decode-only steps: {len(decode)}; median step {med['ms']:.2f} ms = schedule "
          f"{med['schedule_ms']:.2f} + launch {med['launch_ms']:.2f} + wait {med['wait_ms']:.2f}"
          f" (+ the rest of the loop); step end to step end {statistics.median(gaps):.2f} ms; "
          f"the client's time per output token "
          f"{statistics.median(1e3 * (e - f) / (max_tokens - 1) for _, f, _, e, _ in times):.2f} ms")


def media_load_ms(image_b64: str, repeats: int = 5) -> float:
    from autoglm_serve.multimodal.media import MediaLoader
    loader, url, times = MediaLoader(), f"data:image/png;base64,{image_b64}", []
    for _ in range(repeats):
        t = time.perf_counter()
        loader.load(url).content_hash      # the hash runs on a worker thread
        times.append(1e3 * (time.perf_counter() - t))
    return statistics.median(times)


async def episode(base: str, model: str, steps: int, max_tokens: int, seed: int,
                  logprobs: bool) -> list:
    ep = PhoneEpisode(0, TASKS[seed % len(TASKS)])
    out = []
    async with httpx.AsyncClient(timeout=300) as client:
        for step in range(steps):
            messages = ep.add_screen(step, screenshot_png_base64(seed, 0, step))
            sums = await server_sums(client, base)
            sent, first, first_text, end, text = await send(client, base, model, messages,
                                                            max_tokens, logprobs)
            out.append((sent, first, first_text, end, await server_times(client, base, sums)))
            ep.add_reply(text or "<think>ok</think><answer>do(action=\"Back\")</answer>")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--server-args", default="")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--logprobs", action="store_true",
                    help="ask for logprobs (each token in its own chunk); the smoke always does")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/ttft_timeline"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    serve = [sys.executable, "-m", "autoglm_serve.cli", "serve"]
    model = "autoglm-phone-9b"
    if args.smoke:
        from tests.glm4v_fixtures import make_tiny_glm4v
        path = make_tiny_glm4v(os.path.join(args.out, "tiny-glm4v"))
        serve += [str(path), "--max-model-len", "4096", "--mm-processor-kwargs",
                  '{"max_pixels": 200000}']
        args.steps, args.max_tokens, args.logprobs = 3, 8, True
    else:
        serve += [model, "--load-format", "dummy", "--max-model-len", "25480",
                  "--mm-processor-kwargs", '{"max_pixels": 5000000}',
                  "--limit-mm-per-prompt", '{"image":10}']
    trace = os.path.join(args.out, "steps.jsonl")
    port = free_port()
    serve += ["--served-model-name", model, "--host", "127.0.0.1", "--port", str(port),
              "--step-trace", trace] + args.server_args.split()
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    server = ServerProcess(serve, port, os.path.join(args.out, "server.log"), env=env,
                           cwd=ROOT).start(timeout_s=600)
    try:
        # a first episode warms what a first request pays once (compiles, plans)
        asyncio.run(episode(server.base_url, model, 2, args.max_tokens, 100, args.logprobs))
        times = asyncio.run(episode(server.base_url, model, args.steps, args.max_tokens, 1,
                                    args.logprobs))
    except Exception:
        print(f"the server's log, its end:\n{server.log(6000)}", file=sys.stderr)
        raise
    finally:
        server.stop()
    with open(trace) as f:
        steps = [json.loads(line) for line in f]
    rows = []
    for i, (sent, first, first_text, end, server) in enumerate(times):
        row = dict(step=i, **attribute(steps, sent, first), step_ms=1e3 * (end - sent),
                   held_ms=1e3 * ((first_text or end) - first), **server)
        if "ttft_ms" in row and server:
            # the client's send to the engine's arrival, plus the first token's way back
            row["to_engine_ms"] = row["ttft_ms"] - server["server_ttft_ms"]
        rows.append(row)
    load_ms = media_load_ms(screenshot_png_base64(1, 0, 0))
    keys = ("ttft_ms", "before_ms", "to_engine_ms", "queue_ms", "vision_ms", "prompt_ms",
            "after_ms", "held_ms", "step_ms")
    print(f"the server's image loading alone (decode, RGB, hash) on this CPU: {load_ms:.1f} ms")
    print("| step | TTFT ms | before ms | to the engine ms | queue ms | vision steps ms | "
          "prompt steps ms | after ms | text held ms | step latency ms | work steps | "
          "prompt tokens | vision tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        cells = " | ".join(f"{r[k]:.1f}" if k in r else "—" for k in keys)
        print(f"| {r['step']} | {cells} | {r.get('work_steps', '—')} | "
              f"{r.get('prompt_tokens', '—')} | {r.get('encoder_tokens', '—')} |")
    full = [r for r in rows if "ttft_ms" in r]
    if full:
        med = {k: statistics.median(r[k] for r in full if k in r) if any(k in r for r in full)
               else float("nan") for k in keys}
        print("| median | " + " | ".join(f"{med[k]:.1f}" for k in keys) + " | | | |")
    print_decode_steps(steps, times, args.max_tokens)
    with open(os.path.join(args.out, "ttft_timeline.json"), "w") as f:
        json.dump(dict(rows=rows, media_load_ms=load_ms, server_args=serve,
                       trace=[s for s in steps if times[0][0] <= s["t"]]), f, indent=1)


if __name__ == "__main__":
    main()
