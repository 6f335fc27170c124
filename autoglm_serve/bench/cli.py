"""Command line of `autoglm-serve bench serve|offline|compare` and `autoglm-serve tune`.

The main CLI calls add_bench_subcommands / add_tune_subcommand; `python -m autoglm_serve.bench`
runs the same commands standalone. Each subcommand sets `func(args) -> exit code`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import math
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from autoglm_serve.help_formatter import DefaultsHelpFormatter
from autoglm_serve.bench.metrics import parse_slo


def _concurrency_list(text: str) -> list[int | None]:
    """'8' or '1,4,8,16'; 'inf' or 0 means no limit."""
    out: list[int | None] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if part.lower() in ("inf", "none", "0"):
            out.append(None)
        else:
            value = int(part)
            if value < 0:
                raise argparse.ArgumentTypeError("concurrency must be positive")
            out.append(value)
    if not out:
        raise argparse.ArgumentTypeError("empty concurrency list")
    return out


def _int_list(text: str) -> list[int]:
    return [int(p) for p in text.split(",") if p.strip()]


def _float_list(text: str) -> list[float]:
    return [float(p) for p in text.split(",") if p.strip()]


def _bool_list(text: str) -> list[bool]:
    vals = {"on": True, "true": True, "1": True, "off": False, "false": False, "0": False}
    try:
        return [vals[p.strip().lower()] for p in text.split(",") if p.strip()]
    except KeyError as exc:
        raise argparse.ArgumentTypeError(f"expected on/off, got {exc}") from exc


def _rate(text: str) -> float:
    value = float(text)  # float("inf") works
    if value <= 0:
        raise argparse.ArgumentTypeError("--request-rate must be > 0 (or inf)")
    return value


def _json_obj(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--dataset", default="random",
                   help="random | FILE.jsonl ({'prompt'|'messages', 'output_len'?} per line) | "
                        "ShareGPT FILE.json | phone-agent (serve only)")
    g.add_argument("--num-prompts", type=int, default=100)
    g.add_argument("--input-len", type=int, default=1024, help="random dataset: prompt tokens")
    g.add_argument("--output-len", type=int, default=None,
                   help="max tokens per request (random default 128; overrides file lengths)")
    g.add_argument("--range-ratio", type=float, default=0.0,
                   help="random lengths uniform in [len*(1-r), len*(1+r)]")
    g.add_argument("--ignore-eos", action="store_true",
                   help="generate exactly --output-len tokens (vLLM/SGLang/ours; some servers refuse it)")
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer (a local path, or a name in the local hub cache; never "
                        "downloaded) for prompt lengths; without it lengths are counted in "
                        "words and output tokens from the server's usage")
    g.add_argument("--goodput", nargs="+", default=[], metavar="NAME:MS",
                   help="SLOs for goodput, e.g. ttft:500 tpot:50 e2el:10000 (milliseconds)")


def _add_output_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("output")
    g.add_argument("--label", default="", help="name of this run in tables and plots")
    g.add_argument("--out", default=None, help="output folder (default: bench-results/LABEL-TIME)")
    g.add_argument("--gpu-monitor", action=argparse.BooleanOptionalAction, default=None,
                   help="sample GPU utilization/memory via NVML (default: on when a GPU is found)")
    g.add_argument("--gpu-interval", type=float, default=0.1, help="GPU sampling period (s)")
    g.add_argument("--fail-on-error", action="store_true",
                   help="exit with status 1 when any request failed")


def _add_serve_args(p: argparse.ArgumentParser, *, for_tune: bool = False) -> None:
    g = p.add_argument_group("server")
    if not for_tune:
        g.add_argument("--base-url", default="http://127.0.0.1:8000")
        g.add_argument("--model", default=None,
                       help="model name the server knows (default: the first of GET /v1/models)")
    g.add_argument("--endpoint", default="/v1/chat/completions",
                   help="/v1/chat/completions or /v1/completions")
    g.add_argument("--api-key", default=None)
    g.add_argument("--extra-body", type=_json_obj, default={},
                   help="JSON merged into every request body")
    g.add_argument("--request-timeout", type=float, default=600.0,
                   help="seconds before a request counts as failed")
    g.add_argument("--request-rate", type=_rate, default=math.inf,
                   help="requests (phone-agent: agent starts) per second, Poisson; inf = all at once")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of arrival gaps: 1 = Poisson, <1 burstier, >1 smoother")
    g.add_argument("--max-concurrency", type=_concurrency_list, default=[None],
                   help="cap on requests in flight, or a sweep: 1,4,8,16,32,64")
    a = p.add_argument_group("phone-agent dataset")
    a.add_argument("--agents", type=int, default=None,
                   help="simulated agents (default: the concurrency of each sweep point)")
    a.add_argument("--steps", type=int, default=5, help="steps per agent episode")
    a.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds between a reply and the next screenshot (the phone acting)")
    if not for_tune:
        p.add_argument("--no-progress", action="store_true", help="no progress bar")
        p.add_argument("--no-warmup", action="store_true",
                       help="skip the first check request before measuring")


def add_bench_subcommands(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    bench = subparsers.add_parser("bench", help="serving benchmarks: serve | offline | compare")
    sub = bench.add_subparsers(dest="bench_command", required=True)

    serve = sub.add_parser("serve", help="benchmark an OpenAI-compatible server",
                           formatter_class=DefaultsHelpFormatter)
    _add_serve_args(serve)
    _add_workload_args(serve)
    _add_output_args(serve)
    serve.set_defaults(func=cmd_bench_serve)

    offline = sub.add_parser("offline", help="benchmark our engine through the offline API",
                             formatter_class=DefaultsHelpFormatter)
    offline.add_argument("model", nargs="?", default=None,
                         help="model path or name (default: the engine's built-in model)")
    offline.add_argument("--max-num-seqs", type=_concurrency_list, default=[None],
                         help="engine concurrency, or a sweep 1,4,8 (rebuilds the engine per point)")
    offline.add_argument("--engine-args", type=_json_obj, default={},
                         help='JSON of further LLM(...) arguments, e.g. {"load_format": "dummy"}')
    offline.add_argument("--no-warmup", action="store_true")
    _add_workload_args(offline)
    _add_output_args(offline)
    offline.set_defaults(func=cmd_bench_offline)

    compare = sub.add_parser("compare", help="several results in one table and one plot")
    compare.add_argument("results", nargs="+", help="results.json files or result folders")
    compare.add_argument("--out", default="bench-results/compare", help="output folder")
    compare.set_defaults(func=cmd_bench_compare)
    return bench


def add_tune_subcommand(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    tune = subparsers.add_parser(
        "tune", help="search server settings for the best goodput under an SLO",
        formatter_class=DefaultsHelpFormatter)
    tune.add_argument("model", nargs="?", default=None)
    tune.add_argument("--slo", required=True, help="e.g. ttft:2000,tpot:100 (milliseconds)")
    tune.add_argument("--slo-attainment", type=float, default=0.9,
                      help="share of requests that must meet the SLO")
    tune.add_argument("--budget-minutes", type=float, default=30.0)
    tune.add_argument("--max-num-seqs", type=_int_list, default=[64, 128, 256], dest="t_seqs")
    tune.add_argument("--max-num-batched-tokens", type=_int_list, default=[4096, 8192, 16384],
                      dest="t_tokens")
    tune.add_argument("--gpu-memory-utilization", type=_float_list, default=[0.9], dest="t_mem")
    tune.add_argument("--chunked-prefill", type=_bool_list, default=[True, False], dest="t_chunk",
                      help="on,off")
    tune.add_argument("--serve-command", default=None,
                      help="how to start the server (default: autoglm-serve serve)")
    tune.add_argument("--serve-args", default="", help="further server flags, as one string")
    tune.add_argument("--port", type=int, default=0, help="0: any free port")
    tune.add_argument("--startup-timeout", type=float, default=900.0)
    tune.add_argument("--log-dir", default=None, help="server logs (default: a temp folder)")
    _add_serve_args(tune, for_tune=True)
    _add_workload_args(tune)
    tune.set_defaults(func=cmd_tune, num_prompts=None)
    return tune


def _default_out(label: str) -> Path:
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "run"
    return Path("bench-results") / f"{safe}-{stamp}"


def _discover_model(base_url: str, api_key: str | None) -> str:
    import httpx

    url = base_url.rstrip("/")
    url = url + ("/models" if url.endswith("/v1") else "/v1/models")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        data = httpx.get(url, headers=headers, timeout=10, trust_env=False).json()
        return data["data"][0]["id"]
    except Exception as exc:  # noqa: BLE001
        raise SystemExit(f"error: no --model given and {url} did not name one ({exc})") from exc


def _client_config(args: argparse.Namespace, base_url: str, model: str):
    from autoglm_serve.bench.client import ClientConfig

    return ClientConfig(
        base_url=base_url, model=model, endpoint=args.endpoint, api_key=args.api_key,
        temperature=args.temperature, ignore_eos=args.ignore_eos, extra_body=args.extra_body,
        request_timeout_s=args.request_timeout,
        # --seed seeds the dataset and arrivals only; a per-request seed goes in --extra-body.
    )


def _serve_config(args: argparse.Namespace, client) -> Any:
    from autoglm_serve.bench.runner import ServeBenchConfig

    return ServeBenchConfig(
        client=client, dataset=args.dataset, num_prompts=args.num_prompts or 100,
        input_len=args.input_len, output_len=args.output_len, range_ratio=args.range_ratio,
        request_rate=args.request_rate, burstiness=args.burstiness,
        concurrencies=args.max_concurrency, seed=args.seed, tokenizer=args.tokenizer,
        slo=parse_slo(args.goodput), agents=args.agents, steps=args.steps,
        step_delay_s=args.step_delay, label=getattr(args, "label", ""),
        gpu_monitor=getattr(args, "gpu_monitor", None),
        gpu_interval_s=getattr(args, "gpu_interval", 0.1),
        progress=not getattr(args, "no_progress", True),
        warmup=not getattr(args, "no_warmup", False),
    )


def _finish(result: dict[str, Any], args: argparse.Namespace) -> int:
    """Write JSON, table and plots; print the table; the exit code."""
    from autoglm_serve.bench.plots import plot_gpu_timeline, plot_latency_throughput
    from autoglm_serve.bench.report import markdown_report, write_result

    out = Path(args.out) if args.out else _default_out(result["label"])
    json_path = write_result(result, out)
    plot_latency_throughput([result], out / "latency_throughput.png", title=result["label"])
    gpu_png = plot_gpu_timeline(result, out / "gpu_timeline.png")
    print()
    print(markdown_report(result))
    print(f"results: {json_path}")
    print(f"table:   {out / 'summary.md'}")
    print(f"plots:   {out / 'latency_throughput.png'}" + (f", {gpu_png}" if gpu_png else
                                                           " (no GPU timeline: no GPU samples)"))
    failed = sum(p["summary"]["failed"] for p in result["points"])
    if failed and args.fail_on_error:
        print(f"{failed} request(s) failed (--fail-on-error)", file=sys.stderr)
        return 1
    return 0


def cmd_bench_serve(args: argparse.Namespace) -> int:
    from autoglm_serve.bench.runner import BenchError, run_serve_bench

    try:
        model = args.model or _discover_model(args.base_url, args.api_key)
        cfg = _serve_config(args, _client_config(args, args.base_url, model))
        result = asyncio.run(run_serve_bench(cfg))
    except (BenchError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _finish(result, args)


def cmd_bench_offline(args: argparse.Namespace) -> int:
    from autoglm_serve.bench.offline import OfflineBenchConfig, run_offline_bench
    from autoglm_serve.bench.runner import BenchError

    if args.dataset == "phone-agent":
        print("error: bench offline takes random or file datasets; phone-agent needs the server",
              file=sys.stderr)
        return 2
    try:
        cfg = OfflineBenchConfig(
            model=args.model, dataset=args.dataset, num_prompts=args.num_prompts,
            input_len=args.input_len, output_len=args.output_len, range_ratio=args.range_ratio,
            max_num_seqs=args.max_num_seqs, temperature=args.temperature,
            ignore_eos=args.ignore_eos, seed=args.seed, tokenizer=args.tokenizer,
            engine_args=args.engine_args, slo=parse_slo(args.goodput), label=args.label,
            gpu_monitor=args.gpu_monitor, gpu_interval_s=args.gpu_interval,
            warmup=not args.no_warmup,
        )
        result = run_offline_bench(cfg)
    except (BenchError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _finish(result, args)


def cmd_bench_compare(args: argparse.Namespace) -> int:
    from autoglm_serve.bench.compare import compare

    table, png = compare(args.results, args.out)
    print(table)
    print(f"plot:  {png}")
    print(f"table: {Path(args.out) / 'compare.md'}")
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from autoglm_serve.bench.runner import BenchError
    from autoglm_serve.bench.tune import TuneConfig, serve_command_line, trials_table, tune

    try:
        slo = parse_slo([args.slo])
        if args.num_prompts is None:  # short benchmarks: a try should take about a minute
            args.num_prompts = 50
        args.label, args.gpu_monitor = "tune", None
        model_name = args.model or "default"
        bench = _serve_config(args, _client_config(args, "http://127.0.0.1", model_name))
        cfg = TuneConfig(
            model=args.model, slo=slo, budget_minutes=args.budget_minutes,
            slo_attainment=args.slo_attainment, max_num_seqs=args.t_seqs,
            max_num_batched_tokens=args.t_tokens, gpu_memory_utilization=args.t_mem,
            chunked_prefill=args.t_chunk,
            serve_command=shlex.split(args.serve_command) if args.serve_command else [],
            extra_serve_args=shlex.split(args.serve_args), port=args.port,
            startup_timeout_s=args.startup_timeout, bench=bench, log_dir=args.log_dir,
        )
        best, trials = tune(cfg)
    except (BenchError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print()
    print(trials_table(trials, best))
    print()
    if best is None:
        print(f"no setting met the SLO ({args.slo}) for {100 * args.slo_attainment:.0f}% of "
              "requests; try a looser SLO, a lower load, or more candidates")
        return 1
    print(f"best: goodput {best.goodput:.2f} req/s with the SLO met by "
          f"{100 * (best.attainment or 0):.0f}% of requests")
    print(serve_command_line(cfg, best.candidate))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="autoglm-serve")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_subcommands(sub)
    add_tune_subcommand(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)
