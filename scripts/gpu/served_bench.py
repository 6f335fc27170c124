"""Our engine served over HTTP: 256 concurrent streams vs the same engine offline.

    python scripts/gpu/served_bench.py [--port 8011] [--num-requests 256]
    python scripts/gpu/served_bench.py --smoke          # CPU, tiny GLM-4.1V, every code path

Starts `python -m autoglm_serve.cli serve autoglm-phone-9b --load-format dummy ...`, waits for
/health (up to --server-timeout-s), warms it up, then sends --num-requests streaming
/v1/completions at once (512 prompt token ids, 256 new tokens, ignore_eos; --rounds times on
the same server, the median round is the figure) and reports output tok/s = completion
tokens / (last response end - first request sent), with TTFT and GPU utilization. The issue asks for >= 90% of offline: the offline figure is read from
$OUT/engine_bench.json (or --offline-json): its throughput256 figure, the same 256 x 512/256 in
one LLM.generate with the same engine settings. Without one (a GPU call of its own), it is
measured after the server stops, by engine_bench.py --only throughput256 (one more model load).

The packaged config has no tokenizer and the server needs one (to stream text), so unless
--tokenizer is given a synthetic one is written: token i <-> the word "t{i}", whitespace split,
covering the whole vocabulary. Its cost per token is close to a real detokenizer's.
Runtime on an H200: server start (~1-2 min) + warm-up + ~10 s of load, then the offline peer
(~2 min) when needed; at most ~8 min with the default time limits.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), HERE]
from autoglm_serve.bench.server_process import ServerProcess  # noqa: E402


def synthetic_tokenizer(path: str, vocab_size: int) -> str:
    """A tokenizer that can decode every id of the model: id i is the word "t{i}"."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {f"t{i}": i for i in range(vocab_size - 1)}
    vocab["<unk>"] = vocab_size - 1
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(path)
    return path


def model_vocab(model: str) -> tuple[int, int]:
    """(vocab size, first special id) from the model's config.json."""
    from autoglm_serve.engine.core.model_setup import BUILTIN_CONFIGS
    d = BUILTIN_CONFIGS.get(model.lower(), model)
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    tc = cfg.get("text_config", cfg)
    eos = tc.get("eos_token_id") or []
    specials = [tc.get("pad_token_id") or tc["vocab_size"], *(eos if isinstance(eos, list) else [eos])]
    return tc["vocab_size"], min(150000, *specials)


def start_server(args, tokenizer: str | None, log_path: str) -> ServerProcess:
    """Our server as a child process (autoglm_serve/bench/server_process.py)."""
    cmd = [sys.executable, "-m", "autoglm_serve.cli", "serve", args.model,
           "--load-format", "dummy", "--dtype", args.dtype, "--host", "127.0.0.1",
           "--port", str(args.port), "--max-model-len", str(args.max_model_len),
           "--max-num-seqs", str(args.max_num_seqs),
           "--max-num-batched-tokens", str(args.max_num_batched_tokens),
           "--disable-uvicorn-access-log", "--uvicorn-log-level", "warning"]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    if args.smoke:
        cmd += ["--device", "cpu", "--kv-cache-memory-gib", "0.25", "--enforce-eager"]
    else:
        cmd += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    cmd += args.server_arg
    print("server: " + " ".join(cmd[1:]), flush=True)
    return ServerProcess(cmd, args.port, log_path, cwd=ROOT).spawn()


async def load(base: str, model: str, prompts: list[list[int]], output_len: int,
               timeout: float):
    """All prompts at once as streaming /v1/completions; RequestRecords and (t_first, t_last)."""
    from autoglm_serve.bench.client import ClientConfig, make_http_client, send_request
    from autoglm_serve.bench.datasets import BenchRequest
    cfg = ClientConfig(base_url=base, model=model, endpoint="/v1/completions", ignore_eos=True,
                       request_timeout_s=timeout)

    def payload(ids):
        return {"model": model, "prompt": ids, "max_tokens": output_len, "temperature": 0.0,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}

    async with make_http_client(cfg, len(prompts)) as http:
        reqs = [BenchRequest(prompt="", prompt_len=len(p), output_len=output_len,
                             prompt_token_ids=p) for p in prompts]
        return await asyncio.gather(*(send_request(http, cfg, r, i, payload=payload(r.prompt_token_ids))
                                      for i, r in enumerate(reqs)))


def summarize(records, wall: float) -> dict:
    # a complete stream whose random tokens decode to no text still counts (its usage says how many)
    ok = [r for r in records if r.success or (r.output_tokens and "no generated text" in r.error)]
    tokens = sum((r.output_tokens if r.output_tokens is not None else len(r.chunk_times)) for r in ok)
    ttft = sorted((r.chunk_times[0] - r.start) * 1e3 for r in ok if r.chunk_times)
    return dict(requests=len(records), ok=len(ok), output_tokens=tokens, seconds=wall,
                out_tok_s=tokens / wall if wall > 0 else None,
                tokens_from_usage=all(r.output_tokens is not None for r in ok),
                ttft_ms_p50=ttft[len(ttft) // 2] if ttft else None,
                ttft_ms_p99=ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))] if ttft else None,
                errors=sorted({r.error for r in records if not r.success})[:5])


def offline_figure(path: str) -> tuple[float | None, str]:
    try:
        with open(path) as f:
            ours = json.load(f).get("ours", {})
    except (OSError, json.JSONDecodeError):
        return None, f"no {path}"
    for key in ("throughput256", "throughput"):
        fig = ours.get(key) or {}
        if fig.get("out_tok_s") and not fig.get("truncated"):
            return fig["out_tok_s"], f"{key} ({fig.get('num_requests')} requests) from {path}"
    return None, f"no offline throughput in {path}"


def run_offline_peer(args, out_dir: str) -> str:
    """No engine_bench.json here (a separate GPU call): measure the same 256 x 512/256 offline
    with engine_bench.py's throughput256 figure, after the server has freed the GPU."""
    peer_out = os.path.join(out_dir, "offline_peer")
    os.makedirs(peer_out, exist_ok=True)
    cmd = [sys.executable, os.path.join(HERE, "engine_bench.py"), "--skip-baseline", "--no-limits",
           "--only", "throughput256", "--served-requests", str(args.num_requests),
           "--input-len", str(args.input_len), "--output-len", str(args.output_len),
           "--max-num-seqs", str(args.max_num_seqs), "--budget-s", str(args.offline_timeout_s - 20),
           "--ours-timeout-s", str(args.offline_timeout_s - 20)]
    if args.smoke:
        cmd.append("--smoke")
    print("\noffline peer: " + " ".join(cmd[1:]), flush=True)
    try:
        subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OUT": peer_out},
                       timeout=args.offline_timeout_s)
    except subprocess.TimeoutExpired:
        print("offline peer: time limit", flush=True)
    return os.path.join(peer_out, "engine_bench.json")


async def main_async(args) -> dict:
    from engine_figures import gpu_window, make_monitor
    out_dir = os.environ.get("OUT", "/tmp")
    base = f"http://127.0.0.1:{args.port}"
    vocab, floor = model_vocab(args.model)
    tokenizer = args.tokenizer
    if tokenizer is None and not args.smoke:
        tokenizer = synthetic_tokenizer(tempfile.mkdtemp(prefix="synth_tok_"), vocab)
    result: dict = dict(args=vars(args))
    mon = make_monitor()
    server = start_server(args, tokenizer, os.path.join(out_dir, "served_server.log"))
    try:
        t_start = time.monotonic()
        why = await asyncio.to_thread(server.wait_healthy, args.server_timeout_s)
        if why is not None:
            raise RuntimeError(f"server {why}:\n{server.log(3000)}")
        result["startup_s"] = time.monotonic() - t_start
        print(f"server healthy after {result['startup_s']:.0f}s", flush=True)
        rng = random.Random(0)
        t0 = time.monotonic()   # warm-up: every decode batch size, outside the timing
        warm = await load(base, args.model, [[rng.randrange(floor) for _ in range(32)]
                                             for _ in range(args.num_requests)], 8,
                          min(60.0, args.run_timeout_s))
        result["warmup"] = summarize(warm, time.monotonic() - t0)
        print(f"warm-up: {result['warmup']}", flush=True)
        rounds = []
        for _ in range(args.rounds):   # fresh prompts each round: no prefix-cache hits
            prompts = [[rng.randrange(floor) for _ in range(args.input_len)]
                       for _ in range(args.num_requests)]
            t0 = time.perf_counter()
            records = await load(base, args.model, prompts, args.output_len, args.run_timeout_s)
            t1 = time.perf_counter()
            starts = [r.start for r in records]
            ends = [r.end for r in records]
            run = summarize(records, max(ends) - min(starts))
            run["gpu"] = gpu_window(mon, t0, t1)
            rounds.append(run)
            print(f"served: {run}", flush=True)
        result["rounds"] = rounds
        # the figure: the median round (the rounds show the spread)
        result["served"] = sorted(rounds, key=lambda r: r["out_tok_s"] or 0)[len(rounds) // 2]
    except Exception as e:  # report what there is: the server log says why
        result["error"] = f"{type(e).__name__}: {e}"[:3000]
        print(result["error"], flush=True)
    finally:
        server.stop()
        if mon is not None:
            mon.stop()
    path = args.offline_json or os.path.join(out_dir, "engine_bench.json")
    offline, source = offline_figure(path)
    if offline is None and args.offline_peer:
        path = run_offline_peer(args, out_dir)
        offline, source = offline_figure(path)
    result.update(offline_out_tok_s=offline, offline_source=source)
    served = (result.get("served") or {}).get("out_tok_s")
    result["ratio"] = served / offline if served and offline else None
    return result


def markdown(result: dict) -> str:
    s = result.get("served") or {}
    g = s.get("gpu") or {}

    def f(v, spec=",.0f", unit=""):
        return "n/a" if v is None else f"{v:{spec}}{unit}"
    mem = g.get("mem_peak_mib")
    served = (f"{f(s.get('out_tok_s'))} tok/s ({s.get('ok')}/{s.get('requests')} ok, TTFT p50 "
              f"{f(s.get('ttft_ms_p50'))} ms, p99 {f(s.get('ttft_ms_p99'))} ms)"
              if s else f"FAILED: {result.get('error', '')[:150]}")
    ratio = result.get("ratio")
    a = result["args"]
    return ("| figure | served (HTTP, streaming) | offline (same engine) | ratio | target | "
            "GPU util mean | peak mem |\n| --- | --- | --- | --- | --- | --- | --- |\n"
            f"| {a['num_requests']} streams, {a['input_len']} in / {a['output_len']} out | {served} | "
            f"{f(result.get('offline_out_tok_s'))} tok/s | "
            f"{'n/a' if ratio is None else f'{100 * ratio:.0f}%'} | >= 90% | "
            f"{f(g.get('util_mean'), '.0f', '%')} | {f(None if mem is None else mem / 1024, '.1f', ' GiB')} |\n"
            f"\noffline: {result.get('offline_source')}; server start {f(result.get('startup_s'), '.0f')} s"
            + (f"; rounds: {', '.join(f(r.get('out_tok_s')) for r in result['rounds'])} tok/s"
               if len(result.get("rounds") or []) > 1 else ""))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="autoglm-phone-9b")
    ap.add_argument("--tokenizer", default=None, help="default: a synthetic one (see above)")
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--num-requests", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--server-arg", action="append", default=[],
                    help="extra argument for `serve` (repeat; e.g. --server-arg=--enforce-eager)")
    ap.add_argument("--server-timeout-s", type=float, default=240)
    ap.add_argument("--rounds", type=int, default=1,
                    help="timed loads on the same server; the figure is the median")
    ap.add_argument("--run-timeout-s", type=float, default=120, help="per request")
    ap.add_argument("--offline-json", default=None, help="default: $OUT/engine_bench.json")
    ap.add_argument("--no-offline-peer", dest="offline_peer", action="store_false",
                    help="without an offline figure, do not measure one (engine_bench.py)")
    ap.add_argument("--offline-timeout-s", type=float, default=200)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny GLM-4.1V, tiny shapes")
    args = ap.parse_args(argv)
    if args.smoke:
        from glm4v_fixtures import make_tiny_glm4v
        if args.model == "autoglm-phone-9b":
            args.model = str(make_tiny_glm4v(os.path.join(tempfile.gettempdir(), "served_bench_tiny")))
        args.dtype, args.num_requests, args.input_len, args.output_len = "float32", 8, 32, 8
        args.max_model_len, args.max_num_seqs, args.max_num_batched_tokens = 1024, 16, 512
    return args


def main() -> None:
    args = parse_args()
    result = asyncio.run(main_async(args))
    path = os.path.join(os.environ.get("OUT", "/tmp"), "served_bench.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\n(raw numbers in {path})\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
