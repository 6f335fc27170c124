#!/usr/bin/env python
"""CPU benchmark of the server on the embedded default (SmolLM2-135M-Instruct), in one run:

1. the same prompts through our server and through `transformers serve --continuous-batching`
   (a safetensors copy of the same GGUF weights): request throughput, TTFT p50/p99, output tok/s;
2. our server against our offline engine (LLM.generate) at 64 concurrent streams: served output
   throughput as a share of offline.

    python scripts/bench_cpu_server.py --num-prompts 64 --max-tokens 64

Prints markdown tables for BENCHMARKS.md. Servers run one at a time, so they do not share the CPU.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from autoglm_serve.bench.server_process import ServerProcess, free_port  # noqa: E402

TOPICS = ["cats", "the moon", "bread", "rivers", "chess", "volcanoes", "tea", "bicycles",
          "owls", "glass", "maps", "thunder", "bees", "paper", "clocks", "whales"]


def prompts(n: int) -> list[str]:
    return [f"Question {i}: tell me three short facts about {TOPICS[i % len(TOPICS)]}."
            for i in range(n)]


@dataclass
class Result:
    label: str
    requests: int
    seconds: float
    output_tokens: int
    ttfts: list[float]

    @property
    def req_per_s(self) -> float:
        return self.requests / self.seconds

    @property
    def tok_per_s(self) -> float:
        return self.output_tokens / self.seconds

    def pct(self, q: float) -> float:
        xs = sorted(self.ttfts)
        return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def start(cmd: list[str], port: int, log: Path) -> ServerProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    return ServerProcess(cmd, port, log, env=env, cwd=ROOT).start(900)


async def _one(c: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
               extra: dict, count) -> tuple[float | None, int]:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, **extra}
    t0 = time.monotonic()
    ttft, text, usage = None, "", None
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]
            for ch in data.get("choices") or []:
                piece = (ch.get("delta") or {}).get("content") or ""
                if piece and ttft is None:
                    ttft = time.monotonic() - t0
                text += piece
    tokens = usage["completion_tokens"] if usage else count(text)
    return ttft, tokens


async def run_load(base_url: str, model: str, items: list[str], max_tokens: int,
                   concurrency: int, extra: dict, count, label: str) -> Result:
    sem = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base_url, timeout=3600, limits=limits) as c:
        await _one(c, model, "warm up", 4, extra, count)

        async def guarded(p):
            async with sem:
                return await _one(c, model, p, max_tokens, extra, count)

        t0 = time.monotonic()
        out = await asyncio.gather(*[guarded(p) for p in items])
        seconds = time.monotonic() - t0
    return Result(label, len(items), seconds, sum(t for _, t in out),
                  [t for t, _ in out if t is not None])


def safetensors_copy(dest: Path) -> Path:
    """The embedded GGUF, dequantized by transformers and saved as safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from autoglm_serve.loader.default_model import default_model_path
    gguf = default_model_path()
    if not (dest / "config.json").exists():
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                      dtype="float32")
        # A GGUF-loaded model refuses save_pretrained; a plain copy of its (dequantized)
        # tensors does not.
        config = loaded.config
        for attr in ("quantization_config",):
            if hasattr(config, attr):
                delattr(config, attr)
        plain = type(loaded)(config)
        plain.load_state_dict(loaded.state_dict())
        plain.save_pretrained(dest)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dest)
    return dest


def offline(items: list[str], max_tokens: int, max_model_len: int) -> Result:
    from autoglm_serve import LLM, SamplingParams
    llm = LLM(max_model_len=max_model_len)
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    llm.chat([{"role": "user", "content": "warm up"}], SamplingParams(max_tokens=4))
    t0 = time.monotonic()
    outs = llm.chat([[{"role": "user", "content": p}] for p in items], params)
    seconds = time.monotonic() - t0
    return Result("offline engine (LLM.chat)", len(items), seconds,
                  sum(len(o.outputs[0].token_ids) for o in outs), [])


def table(rows: list[Result]) -> str:
    lines = ["| server | requests | wall s | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        p50 = f"{r.pct(0.5):.0f}" if r.ttfts else "-"
        p99 = f"{r.pct(0.99):.0f}" if r.ttfts else "-"
        lines.append(f"| {r.label} | {r.requests} | {r.seconds:.1f} | {r.req_per_s:.2f} | "
                     f"{r.tok_per_s:.1f} | {p50} | {p99} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=64, help="streams in flight")
    ap.add_argument("--max-model-len", type=int, default=1024)
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--workdir", default=None, help="keeps the safetensors copy between runs")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-cpu-"))
    work.mkdir(parents=True, exist_ok=True)
    items = prompts(args.num_prompts)
    from autoglm_serve.loader.default_model import default_model_path
    from autoglm_serve.tokenizer import load_tokenizer
    tok = load_tokenizer(default_model_path())

    def count(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    print(f"# CPU benchmark: {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores, {args.num_prompts} prompts, max_tokens {args.max_tokens}, "
          f"{args.concurrency} concurrent streams", flush=True)

    # 1. our server: the same load as transformers gets, then 64 streams with ignore_eos.
    port = free_port()
    ours = start([sys.executable, "-m", "autoglm_serve.cli", "serve", "--host", "127.0.0.1",
                  "--port", str(port), "--max-model-len", str(args.max_model_len),
                  "--uvicorn-log-level", "warning"], port, work / "ours.log")
    try:
        url = f"http://127.0.0.1:{port}"
        same = asyncio.run(run_load(url, "SmolLM2-135M-Instruct", items, args.max_tokens,
                                    args.concurrency, {}, count, "autoglm-serve"))
        served = asyncio.run(run_load(url, "SmolLM2-135M-Instruct", items, args.max_tokens,
                                      args.concurrency, {"ignore_eos": True,
                                                         "stream_options": {"include_usage": True}},
                                      count, "autoglm-serve (served, ignore_eos)"))
    finally:
        ours.stop()
    print(table([same, served]), flush=True)

    # 2. the offline engine, same prompts and lengths, with the server gone.
    off = offline(items, args.max_tokens, args.max_model_len)
    print(table([off]), flush=True)

    rows = [same]
    # the `transformers` CLI of this interpreter's environment (the venv need not be on PATH)
    hf_cli = Path(sys.executable).with_name("transformers")
    hf_cli = str(hf_cli) if hf_cli.exists() else shutil.which("transformers")
    if not args.skip_transformers and hf_cli:
        model_dir = safetensors_copy(work / "smollm2-safetensors")
        port = free_port()
        hf = start([hf_cli, "serve", str(model_dir), "--continuous-batching",
                    "--device", "cpu", "--dtype", "float32", "--host", "127.0.0.1",
                    "--port", str(port)], port, work / "transformers.log")
        try:
            rows.append(asyncio.run(run_load(
                f"http://127.0.0.1:{port}", str(model_dir), items, args.max_tokens,
                args.concurrency, {}, count, "transformers serve --continuous-batching")))
        finally:
            hf.stop()

    print("\n## Same prompts, both servers (temperature 0, stop at EOS or max_tokens)\n")
    print(table(rows))
    print(f"\n## Served vs offline, {args.concurrency} concurrent streams, "
          f"{args.max_tokens} tokens each (ignore_eos)\n")
    print(table([served, off]))
    print(f"\nserved / offline output throughput: {served.tok_per_s / off.tok_per_s:.1%}")
    print(f"(logs and the safetensors copy: {work})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
