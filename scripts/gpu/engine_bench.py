"""The "GPU fast path" figures of our offline engine next to transformers, in one GPU run.

    python scripts/gpu/engine_bench.py [--skip-baseline] [--only single,throughput,ttft]
    python scripts/gpu/engine_bench.py --smoke          # CPU, tiny GLM-4.1V, every code path

AutoGLM-Phone-9B architecture, random weights, bf16:
- single stream: one 512-token prompt, 256 new tokens; decode tok/s = 255 / (finish - first token);
- offline throughput: 512 requests of 512 in / 256 out submitted together; output tok/s over wall;
- TTFT: one 1080x2400 screenshot (max_pixels 5e6 -> 3,108 image tokens) + 1,000 text tokens;
  cold (new image, new text: no prefix or encoder cache hit), then encoder-cache hit (same image,
  new text before it) and prefix-cache hit (the same prompt again);
- throughput256: 256 x 512/256 at once, the offline peer of served_bench.py.
Each part runs in its own subprocess with a time limit (so a hang loses one part, and the GPU is
empty for the next): our engine (engine_figures.py), then transformers through
.devbench/gpu_baseline.py's own functions (one model build for bs 1, bs 64 and TTFT), then
.devbench/limits.py (decode GEMM ceiling). NVML is sampled every 100 ms. Raw numbers go to
$OUT/engine_bench.json; a markdown table is printed last. About 5 minutes on an H200, never more
than --budget-s (540 s).
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests"), HERE]

from engine_figures import FIGURES, gpu_window, make_monitor, worker_ours  # noqa: E402
from model_flops import load_model_config, offline_flops, ttft_flops  # noqa: E402

SCREENSHOT = os.path.join(ROOT, "tests", "data", "phone_screenshot_1080x2400.png")
DESIGN = dict(bf16_tflops=787.0, decode_ceiling={1: 198, 64: 12263, 256: 30710, 512: 34214})
TARGETS = dict(single=">= 190 tok/s", throughput=">= 15,000 tok/s", ttft="<= 200 ms")


# ---- transformers (worker): gpu_baseline.py's functions, one model build ---------------------
def worker_baseline(args) -> None:
    sys.path.insert(0, args.devbench)
    import gpu_baseline as hf
    import torch

    def attempt(what, fn):
        try:
            return fn()
        except Exception as e:  # report and go on: the other figures still count
            traceback.print_exc()
            hf.emit(kind="error", what=what, err=f"{type(e).__name__}: {e}"[:600])
            torch.cuda.empty_cache()

    attempt("probe", hf.probe)
    attempt("ceilings", hf.ceilings)
    built = attempt("build_glm4v", hf.build_glm4v)
    if built:
        model, cfg = built
        if "ttft" in args.only:
            attempt("ttft", lambda: hf.hf_ttft(model, cfg, args.screenshot, args.ttft_text_tokens))
        if "single" in args.only:
            attempt("bs1", lambda: hf.hf_generate(model, cfg, 1, args.input_len, args.output_len))
        if "throughput" in args.only:
            attempt("bs64", lambda: hf.hf_generate(model, cfg, args.baseline_batch,
                                                   args.input_len, args.output_len))
        del model, cfg, built   # free the GPU for the text model below
        torch.cuda.empty_cache()
    if args.baseline_compile and "single" in args.only:
        built = attempt("build_glm4_text", hf.build_glm4_text)
        if built:
            attempt("compile", lambda: hf.hf_compiled_decode(*built, args.input_len, args.output_len))


# ---- orchestration ---------------------------------------------------------------------------
def run_worker(name: str, cmd: list[str], timeout: float, out_dir: str) -> dict:
    """Runs one part as a subprocess; JSON lines come back with their arrival time (for NVML
    windows); stderr goes to $OUT/<name>.stderr.log. Killed (its process group) at `timeout`."""
    print(f"\n== {name}: {' '.join(cmd[1:])} (limit {timeout:.0f}s)", flush=True)
    log_path = os.path.join(out_dir, f"{name}.stderr.log")
    t0 = time.monotonic()
    with open(log_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                                start_new_session=True, bufsize=1)
        lines: queue.Queue = queue.Queue()

        def read():   # live progress, and each line's arrival time
            for line in proc.stdout:
                lines.put((time.monotonic(), line.rstrip("\n")))
                print(f"   [{name}] {line.rstrip()[:300]}", flush=True)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=max(1.0, timeout))
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)   # our child's own group: it and its children
            rc, timed_out = proc.wait(), True
        reader.join(timeout=5)
    records = []
    while not lines.empty():
        t, line = lines.get()
        if line.startswith("{"):
            try:
                records.append((t, json.loads(line)))
            except json.JSONDecodeError:
                pass
    with open(log_path) as f:
        tail = f.read()[-3000:]
    if rc != 0:
        print(f"   {name} exited {rc}{' (time limit)' if timed_out else ''}; stderr tail:\n{tail}",
              flush=True)
    return dict(rc=rc, timed_out=timed_out, seconds=time.monotonic() - t0, records=records)


def orchestrate(args) -> None:
    out_dir = os.environ.get("OUT", "/tmp")
    os.makedirs(out_dir, exist_ok=True)
    t_start = time.monotonic()
    left = lambda: args.budget_s - (time.monotonic() - t_start)  # noqa: E731
    mon = make_monitor()   # for the transformers windows (our worker samples its own)
    passthrough = [a for a in sys.argv[1:]]
    result: dict = dict(args=vars(args), ours={}, transformers={}, limits=[], workers={})

    if not args.skip_ours:
        reserve = (0 if args.skip_baseline else args.baseline_min_s)
        w = run_worker("ours", [sys.executable, os.path.abspath(__file__), *passthrough,
                                "--worker", "ours"], min(args.ours_timeout_s, left() - reserve),
                       out_dir)
        for _, r in w.pop("records"):
            result["ours"][r["kind"] if r["kind"] != "error" else f"error_{r.get('figure')}"] = r
        result["workers"]["ours"] = w
        print_json_summary("ours", result["ours"])

    baseline = os.path.join(args.devbench, "gpu_baseline.py")
    if not args.skip_baseline and os.path.exists(baseline) and left() > 30:
        reserve = args.limits_s if args.limits else 0
        w = run_worker("transformers", [sys.executable, os.path.abspath(__file__), *passthrough,
                                        "--worker", "baseline"],
                       min(args.baseline_timeout_s, left() - reserve), out_dir)
        hf = result["transformers"]
        for t, r in w.pop("records"):
            key = r["kind"]
            if key == "hf_generate":
                key = f"hf_generate_bs{r['bs']}"
            elif key in ("ceiling", "error"):
                key = f"{key}_{r.get('what')}"
            secs = r.get("seconds")
            if key == "hf_ttft_screenshot":
                secs = sum(r.get("ttft_ms_all", [])) / 1e3
            if secs:
                r["gpu"] = gpu_window(mon, t - secs, t)
            hf[key] = r
        result["workers"]["transformers"] = w
        print_json_summary("transformers", hf)
    elif not args.skip_baseline:
        print(f"\n== transformers: skipped ({baseline} missing or no time left)", flush=True)

    limits = os.path.join(args.devbench, "limits.py")
    if args.limits and os.path.exists(limits) and left() > 20:
        w = run_worker("limits", [sys.executable, limits], min(args.limits_s, left()), out_dir)
        result["limits"] = [r for _, r in w.pop("records")]
        result["workers"]["limits"] = w
    if mon is not None:
        mon.stop()

    result["ceilings"] = ceilings(result, args)
    result["total_s"] = time.monotonic() - t_start
    path = os.path.join(out_dir, "engine_bench.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"\n(total {result['total_s']:.0f}s; raw numbers in {path})\n")
    print(markdown(result, args))


def print_json_summary(name: str, part: dict) -> None:
    for key, r in part.items():
        short = {k: v for k, v in r.items() if not isinstance(v, (list, dict))}
        print(f"   {name}.{key}: {json.dumps(short, default=str)[:400]}", flush=True)


def ceilings(result: dict, args) -> dict:
    cfg = load_model_config()
    hf = result["transformers"]
    tflops = (hf.get("ceiling_bf16_TFLOPs") or {}).get("value") or DESIGN["bf16_tflops"]
    by_b = {r["B"]: r["tok_s"] for r in result["limits"] if "B" in r}
    ttft = result["ours"].get("ttft") or {}
    prompt_tokens = ttft.get("prompt_tokens") or 4118
    image_tokens = ttft.get("image_tokens") or 3108
    flops_ttft = ttft_flops(cfg, prompt_tokens, image_tokens)
    flops_off = offline_flops(cfg, args.num_requests, args.input_len, args.output_len)
    return dict(
        bf16_tflops=tflops, tflops_source="measured" if hf.get("ceiling_bf16_TFLOPs") else "DESIGN",
        decode_gemm_tok_s=by_b or DESIGN["decode_ceiling"], decode_source="limits.py" if by_b else "DESIGN",
        ttft_tflop=flops_ttft / 1e12, ttft_ms=flops_ttft / (tflops * 1e12) * 1e3,
        offline_pflop=flops_off / 1e15,
        offline_compute_tok_s=args.num_requests * args.output_len / (flops_off / (tflops * 1e12)))


def fmt(v, spec=",.0f", unit=""):
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def util_mem(ours_gpu, hf_gpu) -> tuple[str, str]:
    def u(g):
        return fmt((g or {}).get("util_mean"), ".0f", "%")

    def m(g):
        v = (g or {}).get("mem_peak_mib")
        return fmt(None if v is None else v / 1024, ".1f", " GiB")
    return f"{u(ours_gpu)} (hf {u(hf_gpu)})", f"{m(ours_gpu)} (hf {m(hf_gpu)})"


def markdown(result: dict, args) -> str:
    ours, hf, c = result["ours"], result["transformers"], result["ceilings"]
    dec = {int(k): v for k, v in c["decode_gemm_tok_s"].items()}
    rows = []

    s = ours.get("single") or {}
    hf1, hfc = hf.get("hf_generate_bs1") or {}, hf.get("hf_static_compile") or {}
    ours_s = (f"{fmt(s.get('decode_tok_s'), '.1f')} tok/s decode ({fmt(s.get('overall_tok_s'), '.1f')}"
              f" overall, TTFT {fmt(s.get('ttft_ms'), '.0f')} ms)") if s else err_cell(ours, "single")
    hf_s = (f"{fmt(hf1.get('out_tok_s'), '.1f')} tok/s eager" if hf1 else err_cell(hf, "bs1")) + (
        f"; {fmt(hfc.get('out_tok_s'), '.1f')} static+compile" if hfc else "")
    rows.append((f"single stream, {args.input_len} in / {args.output_len} out", ours_s, hf_s,
                 f"{fmt(dec.get(1), '.0f')} tok/s", TARGETS["single"],
                 *util_mem(s.get("gpu"), hf1.get("gpu"))))

    t = ours.get("throughput") or {}
    hfb = hf.get(f"hf_generate_bs{args.baseline_batch}") or {}
    ours_t = (f"{fmt(t.get('out_tok_s'))} tok/s ({t.get('num_requests')} req in "
              f"{fmt(t.get('seconds'), '.1f')} s{', TRUNCATED' if t.get('truncated') else ''})"
              if t else err_cell(ours, "throughput"))
    rows.append((f"offline, {args.num_requests} x {args.input_len} in / {args.output_len} out",
                 ours_t, f"{fmt(hfb.get('out_tok_s'))} tok/s (padded batch {args.baseline_batch})"
                 if hfb else err_cell(hf, "bs64"),
                 f"{fmt(dec.get(256))} / {fmt(dec.get(512))} decode GEMMs B=256/512; "
                 f"{fmt(c['offline_compute_tok_s'])} with prefill FLOPs",
                 TARGETS["throughput"], *util_mem(t.get("gpu"), hfb.get("gpu"))))

    f = ours.get("ttft") or {}
    hft = hf.get("hf_ttft_screenshot") or {}
    ours_f = (f"{fmt(f.get('ttft_ms_median'), '.0f')} ms cold ({f.get('image_tokens')} img + "
              f"{f.get('prompt_tokens')} total tok; encoder hit "
              f"{fmt(f.get('encoder_hit_ttft_ms_median'), '.0f')}, prefix hit "
              f"{fmt(f.get('prefix_hit_ttft_ms'), '.0f')}, wall {fmt(f.get('wall_ms_median'), '.0f')})"
              if f else err_cell(ours, "ttft"))
    rows.append(("TTFT, 1080x2400 screenshot + 1,000 text", ours_f,
                 f"{fmt(hft.get('ttft_ms_median'), '.0f')} ms" if hft else err_cell(hf, "ttft"),
                 f"{c['ttft_ms']:.0f} ms ({c['ttft_tflop']:.0f} TFLOP at {c['bf16_tflops']:.0f} TFLOP/s)",
                 TARGETS["ttft"], *util_mem(f.get("gpu"), hft.get("gpu"))))

    t2 = ours.get("throughput256") or {}
    if t2 or "error_throughput256" in ours:
        rows.append((f"offline, {args.served_requests} x {args.input_len} in / {args.output_len} out"
                     " (served_bench peer)",
                     f"{fmt(t2.get('out_tok_s'))} tok/s" if t2 else err_cell(ours, "throughput256"),
                     "", "", "served >= 90% of this", *util_mem(t2.get("gpu"), None)))

    st, wu = ours.get("startup") or {}, ours.get("warmup") or {}
    model = hf.get("model") or {}
    rows.append(("startup (load + KV + graphs) / warm-up",
                 f"{fmt(st.get('seconds'), '.1f')} s / {fmt(wu.get('seconds'), '.1f')} s",
                 f"build {fmt(model.get('build_s'), '.1f')} s", "", "",
                 *util_mem(st.get("gpu"), None)))

    row_figures = ["single", "throughput", "ttft"] + ["throughput256"] * (len(rows) - 4) + [None]
    wanted = [r for r, fig in zip(rows, row_figures) if fig is None or fig in args.only]
    head = ("| figure | ours | transformers (same run) | ceiling | target | GPU util mean | peak mem |\n"
            "| --- | --- | --- | --- | --- | --- | --- |\n")
    gpu = (ours.get("env") or {}).get("gpu", "?")
    note = (f"\n{gpu}; AutoGLM-Phone-9B architecture, random weights, bf16; ceilings: "
            f"{c['decode_source']} decode GEMMs, {c['tflops_source']} bf16 matmul peak. "
            "Peak mem is NVML device memory: ours preallocates its KV cache "
            f"(gpu_memory_utilization {args.gpu_memory_utilization}).")
    return head + "\n".join("| " + " | ".join(r) + " |" for r in wanted) + "\n" + note


def err_cell(part: dict, figure: str) -> str:
    e = part.get(f"error_{figure}")
    return f"FAILED: {e['err'][:120]}" if e else "not run"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="autoglm-phone-9b")
    ap.add_argument("--only", default=",".join(FIGURES),
                    type=lambda s: [x.strip() for x in s.split(",") if x.strip()],
                    help="comma list of " + ", ".join(FIGURES))
    ap.add_argument("--skip-baseline", action="store_true", help="no transformers run")
    ap.add_argument("--skip-ours", action="store_true", help="only transformers / limits")
    ap.add_argument("--no-limits", dest="limits", action="store_false",
                    help="skip .devbench/limits.py (the decode GEMM ceiling)")
    ap.add_argument("--baseline-compile", action="store_true",
                    help="also transformers' static cache + torch.compile (adds ~2-3 min)")
    ap.add_argument("--devbench", default=os.path.join(ROOT, ".devbench"))
    ap.add_argument("--screenshot", default=SCREENSHOT)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny GLM-4.1V, tiny shapes")
    ap.add_argument("--num-requests", type=int, default=512)
    ap.add_argument("--served-requests", type=int, default=256,
                    help="throughput256: the offline peer of served_bench.py")
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--single-runs", type=int, default=3)
    ap.add_argument("--ttft-runs", type=int, default=5)
    ap.add_argument("--ttft-text-tokens", type=int, default=1000)
    ap.add_argument("--ttft-path", default="auto", choices=["auto", "chat", "tokens"])
    ap.add_argument("--max-pixels", type=int, default=5_000_000)
    ap.add_argument("--baseline-batch", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--quantization", default=None, help="as `serve --quantization`")
    ap.add_argument("--mm-encoder-quantization", default=None)
    ap.add_argument("--max-model-len", type=int, default=8192)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    ap.add_argument("--enforce-eager", action="store_true")
    ap.add_argument("--with-tokenizer", dest="skip_tokenizer_init", action="store_false",
                    help="load the model's tokenizer (the packaged config has none)")
    ap.add_argument("--budget-s", type=float, default=540, help="the whole run, all parts")
    ap.add_argument("--ours-timeout-s", type=float, default=330)
    ap.add_argument("--figure-timeout-s", type=float, default=90, help="per figure of ours")
    ap.add_argument("--baseline-timeout-s", type=float, default=240)
    ap.add_argument("--baseline-min-s", type=float, default=150,
                    help="time kept for transformers when ours runs long")
    ap.add_argument("--limits-s", type=float, default=60)
    ap.add_argument("--worker", choices=["ours", "baseline"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    bad = set(args.only) - set(FIGURES)
    if bad:
        ap.error(f"--only: unknown figure(s) {sorted(bad)}")
    if args.smoke and args.worker != "baseline":
        smoke_settings(args)
    return args


def smoke_settings(args) -> None:
    """CPU: the tiny GLM-4.1V test checkpoint (with tokenizer and chat template), tiny shapes."""
    from glm4v_fixtures import make_tiny_glm4v
    if args.model == "autoglm-phone-9b":
        args.model = str(make_tiny_glm4v(os.path.join(tempfile.gettempdir(), "engine_bench_tiny")))
    args.dtype = "float32"
    args.num_requests, args.served_requests, args.input_len, args.output_len = 16, 8, 32, 8
    args.single_runs, args.ttft_runs, args.ttft_text_tokens = 2, 2, 40
    args.max_pixels, args.max_model_len = 60_000, 1024
    args.max_num_seqs, args.max_num_batched_tokens = 16, 512
    args.enforce_eager = True


def main() -> None:
    args = parse_args()
    if args.worker == "ours":
        worker_ours(args)
    elif args.worker == "baseline":
        worker_baseline(args)
    else:
        orchestrate(args)


if __name__ == "__main__":
    main()
