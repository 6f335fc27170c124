"""Our engine's figures for engine_bench.py, run in its "ours" worker subprocess: single stream,
offline throughput, TTFT of a screenshot prompt. Each figure prints one JSON line (emit)."""
from __future__ import annotations

import base64
import io
import json
import statistics
import time
import traceback
from dataclasses import asdict

FIGURES = ("single", "throughput", "ttft", "throughput256")   # in running order


def emit(kind: str, **kw) -> None:
    """One JSON line on stdout: the worker-to-orchestrator protocol (and the progress log)."""
    print(json.dumps({"kind": kind, **kw}, default=str), flush=True)


def median(xs):
    return statistics.median(xs) if xs else None


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q / 100 * len(xs)))]


# ---- GPU sampling ---------------------------------------------------------------------------
def make_monitor():
    """The bench package's NVML sampler (100 ms); None where it is missing or finds no GPU."""
    try:
        from autoglm_serve.bench.gpu_monitor import GpuMonitor
    except ImportError as e:
        print(f"no GPU monitor: {e}", flush=True)
        return None
    mon = GpuMonitor(interval_s=0.1)
    if not mon.available:
        print(mon.note, flush=True)
        return None
    mon.start()
    return mon


def gpu_window(mon, t0: float, t1: float) -> dict | None:
    # GpuSample.time is perf_counter; request metrics are time.monotonic: the same clock on Linux.
    if mon is None:
        return None
    s = asdict(mon.stats(t0, t1))
    return {k: s[k] for k in ("samples", "util_mean", "util_p50", "mem_peak_mib", "power_mean_w")}


def kernel_busy_time(kernels) -> tuple[float, list[float]]:
    """kernels: (start, end) of each CUDA kernel a profiler saw, sorted by start (any unit).
    Returns the time at least one ran, and the idle gaps between them, in that unit."""
    busy, gaps, end = 0.0, [], kernels[0][0] if kernels else 0.0
    for start, stop in kernels:
        if start > end:
            gaps.append(start - end)
        busy += max(0.0, stop - max(start, end))
        end = max(end, stop)
    return busy, gaps


# ---- driving the engine ----------------------------------------------------------------------
class Deadline(Exception):
    pass


def generate_until(llm, prompts, params, deadline: float):
    """llm.generate that gives up at `deadline` (time.monotonic). It wraps this engine's step
    (between steps, same thread: safe) so one slow figure cannot eat the whole GPU run.
    Returns (outputs or None, output tokens seen so far)."""
    engine = llm.engine
    step = engine.step
    seen: dict[str, int] = {}

    def bounded_step():
        outs = step()
        for o in outs:
            seen[o.request_id] = len(o.outputs[0].token_ids)
        if time.monotonic() > deadline:
            raise Deadline
        return outs

    engine.step = bounded_step
    try:
        outs = llm.generate(prompts, params)
        return outs, sum(len(o.outputs[0].token_ids) for o in outs)
    except Deadline:
        for rid in list(getattr(engine.core, "requests", {})):   # free the engine for what follows
            engine.abort(rid)
        return None, sum(seen.values())
    finally:
        del engine.step   # the class's method again


def token_floor(cfg) -> int:
    """Random prompt ids stay below every special id (real: 151329; the tiny fixture: 256)."""
    tc = getattr(cfg, "text_config", None) or cfg
    ids = [150000, tc.vocab_size]
    for src in (cfg, tc):
        for name in ("pad_token_id", "image_start_token_id", "image_token_id"):
            v = getattr(src, name, None)
            if isinstance(v, int):
                ids.append(v)
        eos = getattr(src, "eos_token_id", None)
        ids += [eos] if isinstance(eos, int) else list(eos or [])
    return min(ids)


def build_llm(args):
    from autoglm_serve import LLM
    kw = dict(load_format="dummy", dtype=args.dtype, max_model_len=args.max_model_len,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              skip_tokenizer_init=args.skip_tokenizer_init, enforce_eager=args.enforce_eager,
              enable_prefix_caching=True, mm_processor_kwargs={"max_pixels": args.max_pixels},
              quantization=args.quantization,
              mm_encoder_quantization=args.mm_encoder_quantization)
    if args.smoke:
        kw.update(device="cpu", kv_cache_memory_gib=0.25)
    else:
        kw.update(gpu_memory_utilization=args.gpu_memory_utilization)
    return LLM(args.model, **kw)


def fig_single(llm, args, mon, rng, floor) -> dict:
    from autoglm_serve import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    start, runs = time.monotonic(), []
    for _ in range(args.single_runs):
        prompt = [rng.randrange(floor) for _ in range(args.input_len)]
        outs, n = generate_until(llm, [prompt], sp, time.monotonic() + args.figure_timeout_s)
        if outs is None:
            return dict(truncated=True, tokens=n, seconds=time.monotonic() - start,
                        gpu=gpu_window(mon, start, time.monotonic()))
        m, n = outs[0].metrics, len(outs[0].outputs[0].token_ids)
        runs.append(dict(tokens=n, ttft_ms=1e3 * (m.first_token_time - m.arrival_time),
                         decode_tok_s=(n - 1) / (m.finished_time - m.first_token_time),
                         overall_tok_s=n / (m.finished_time - m.arrival_time)))
        print(f"  single run: {runs[-1]}", flush=True)
        if time.monotonic() - start > args.figure_timeout_s / 2:
            break
    end = time.monotonic()
    return dict(runs=runs, decode_tok_s=median([r["decode_tok_s"] for r in runs]),
                overall_tok_s=median([r["overall_tok_s"] for r in runs]),
                ttft_ms=median([r["ttft_ms"] for r in runs]), gpu=gpu_window(mon, start, end))


def fig_throughput(llm, args, mon, rng, floor, num_requests: int) -> dict:
    from autoglm_serve import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    prompts = [[rng.randrange(floor) for _ in range(args.input_len)] for _ in range(num_requests)]
    t0 = time.monotonic()
    outs, n = generate_until(llm, prompts, sp, t0 + args.figure_timeout_s)
    t1 = time.monotonic()
    res = dict(num_requests=num_requests, input_len=args.input_len, output_len=args.output_len,
               seconds=t1 - t0, output_tokens=n, out_tok_s=n / (t1 - t0),
               truncated=outs is None, gpu=gpu_window(mon, t0, t1))
    if outs is not None:
        ttft = [1e3 * (o.metrics.first_token_time - o.metrics.arrival_time) for o in outs]
        e2e = [o.metrics.finished_time - o.metrics.arrival_time for o in outs]
        res.update(total_tok_s=(n + num_requests * args.input_len) / (t1 - t0),
                   ttft_ms_p50=pct(ttft, 50), ttft_ms_p99=pct(ttft, 99), e2e_s_p50=pct(e2e, 50),
                   preemptions=sum(getattr(o, "num_preemptions", 0) for o in outs))
    return res


def image_variant(img, k: int):
    """A copy with one pixel changed: new content hash, so no encoder or prefix cache hit."""
    out = img.copy()
    out.putpixel((k % out.width, (k // out.width) % out.height), (k * 37 % 256, k * 91 % 256, 7))
    return out


def text_of_tokens(tokenizer, rng, n: int) -> str:
    """Plain words that the tokenizer turns into about n tokens."""
    words = ["tap", "the", "screen", "button", "open", "settings", "swipe", "left", "search",
             "contact", "message", "send", "back", "home", "scroll", "down", "select", "photo"]
    text = ""
    while len(tokenizer.encode(text, add_special_tokens=False)) < n:
        text += " ".join(rng.choice(words) for _ in range(max(8, n // 8))) + ". "
    ids = tokenizer.encode(text, add_special_tokens=False)[:n]
    return tokenizer.decode(ids)


def fig_ttft(llm, args, mon, rng, floor, cfg) -> dict:
    from PIL import Image

    from autoglm_serve import SamplingParams
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    base = Image.open(args.screenshot).convert("RGB")
    path = args.ttft_path
    if path == "auto":
        path = "chat" if llm.tokenizer is not None else "tokens"
    image_id = cfg.image_token_id

    def prompt_for(img, k):
        """The request (and what to send) for run k; built before the clock starts."""
        if path == "chat":
            png = io.BytesIO()
            img.save(png, format="PNG")
            url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
            content = [{"type": "text", "text": f"step {k} {rng.random():.6f}"},
                       {"type": "image_url", "image_url": {"url": url}},
                       {"type": "text", "text": text_of_tokens(llm.tokenizer, rng, args.ttft_text_tokens)}]
            return [{"role": "user", "content": content}]
        ids = ([rng.randrange(floor) for _ in range(8)]   # unique start: no prefix-cache hit
               + [cfg.image_start_token_id, image_id, cfg.image_end_token_id]
               + [rng.randrange(floor) for _ in range(args.ttft_text_tokens)])
        return ids

    def run(req, img) -> dict:
        t0 = time.monotonic()
        if path == "chat":
            out = llm.chat(req, sp)[0]
        else:   # vLLM's dict prompt: one <|image|> per image, the engine expands it
            try:
                out = llm.generate([{"prompt_token_ids": req, "multi_modal_data": {"image": img}}],
                                   sp)[0]
            except (TypeError, KeyError, AttributeError):
                if not hasattr(llm, "generate_multimodal"):
                    raise
                out = llm.generate_multimodal(req, images=[img], sampling_params=sp)[0]
        encoder = llm.engine.core.runner.encoder_cache
        wall = time.monotonic() - t0
        m = out.metrics
        ids = list(out.prompt_token_ids)
        return dict(ttft_ms=1e3 * (m.first_token_time - m.arrival_time), wall_ms=1e3 * wall,
                    queue_ms=1e3 * ((m.first_scheduled_time or m.arrival_time) - m.arrival_time),
                    prompt_tokens=len(ids), image_tokens=sum(1 for t in ids if t == image_id),
                    cached_tokens=getattr(out, "num_cached_tokens", None),
                    encoder_cache_hits=encoder.hits if encoder is not None else None)

    start = time.monotonic()
    res = dict(path=path, max_pixels=args.max_pixels)
    warm_img = image_variant(base, 10_000)
    res["warmup"] = run(prompt_for(warm_img, 0), warm_img)
    print(f"  ttft warm-up: {res['warmup']}", flush=True)
    cold, imgs = [], []
    for k in range(1, args.ttft_runs + 1):
        img = image_variant(base, k)
        imgs.append(img)
        cold.append(run(prompt_for(img, k), img))
        print(f"  ttft cold {k}: {cold[-1]}", flush=True)
    t_cold = time.monotonic()
    hits = []
    for k, img in enumerate(imgs[:3], start=1):     # same image, new text before it
        hits.append(run(prompt_for(img, 100 + k), img))
    req = prompt_for(imgs[0], 200)
    run(req, imgs[0])
    again = run(req, imgs[0])                        # the identical prompt: a prefix-cache hit
    res.update(cold=cold, encoder_hit=hits, prefix_hit=again,
               ttft_ms_median=median([r["ttft_ms"] for r in cold]),
               wall_ms_median=median([r["wall_ms"] for r in cold]),
               encoder_hit_ttft_ms_median=median([r["ttft_ms"] for r in hits]),
               prefix_hit_ttft_ms=again["ttft_ms"],
               prompt_tokens=cold[0]["prompt_tokens"], image_tokens=cold[0]["image_tokens"],
               gpu=gpu_window(mon, start, t_cold))
    return res


def warm_up(llm, args, rng, floor) -> float:
    """Compilation and graph capture outside the timings: one long prompt, then a full-width
    batch whose requests finish at staggered steps (every decode batch size gets used)."""
    from autoglm_serve import SamplingParams
    t0 = time.monotonic()
    llm.generate([[rng.randrange(floor) for _ in range(args.input_len)]],
                 SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))
    n = min(args.num_requests, args.max_num_seqs)
    llm.generate([[rng.randrange(floor) for _ in range(32)] for _ in range(n)],
                 [SamplingParams(temperature=0, max_tokens=1 + i % 32, ignore_eos=True)
                  for i in range(n)])
    return time.monotonic() - t0


def worker_ours(args) -> None:
    import random

    import torch
    rng = random.Random(0)
    emit("env", torch=torch.__version__, cuda=torch.version.cuda,
         gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    mon = make_monitor()
    t0 = time.monotonic()
    try:
        llm = build_llm(args)
    except Exception as e:
        traceback.print_exc()
        emit("error", figure="startup", err=f"{type(e).__name__}: {e}"[:600])
        raise SystemExit(1)
    startup = time.monotonic() - t0
    core = llm.engine.core
    cfg = core.loaded.hf_config
    info = {k: getattr(getattr(core, "cache", None), k, None)
            for k in ("num_blocks", "block_size", "activation_bytes")}
    emit("startup", seconds=startup, load_seconds=getattr(core.loaded, "load_seconds", None),
         weight_gb=(getattr(core.loaded, "weight_bytes", 0) or 0) / 1e9, **info,
         gpu=gpu_window(mon, t0, time.monotonic()))
    floor = token_floor(cfg)
    try:
        emit("warmup", seconds=warm_up(llm, args, rng, floor))
    except Exception as e:  # report and go on: the figures say more than the warm-up
        traceback.print_exc()
        emit("error", figure="warmup", err=f"{type(e).__name__}: {e}"[:600])
    # The image path is the newest code and a CUDA fault there poisons the process: after the
    # issue's two text figures. throughput256 (served_bench.py's offline peer) matters least.
    figures = [("single", lambda: fig_single(llm, args, mon, rng, floor)),
               ("throughput", lambda: fig_throughput(llm, args, mon, rng, floor, args.num_requests)),
               ("ttft", lambda: fig_ttft(llm, args, mon, rng, floor, cfg)),
               ("throughput256", lambda: fig_throughput(llm, args, mon, rng, floor,
                                                        args.served_requests))]
    for name, fn in figures:
        if name not in args.only:
            continue
        print(f"-- ours: {name}", flush=True)
        try:
            res = fn()
            emit(name, **res)
            if res.get("truncated") and llm.engine.has_unfinished():
                break   # requests left running would distort the later figures
        except Exception as e:  # report and go on: one GPU run should show every figure
            traceback.print_exc()
            emit("error", figure=name, err=f"{type(e).__name__}: {e}"[:600])
        if torch.cuda.is_available():
            emit("memory", after=name, max_allocated_gb=torch.cuda.max_memory_allocated() / 1e9)
    if mon is not None:
        mon.stop()

