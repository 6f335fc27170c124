"""Command-line flags of `autoglm-serve serve` (vLLM's names) → EngineConfig + ServerSettings.

Deployment guides' vLLM lines must work after changing the program name, so the flags keep
vLLM's spellings, `--flag_name` is read as `--flag-name` (as vLLM's parser does), and a value
we cannot honour is a startup error that says so rather than being silently ignored.
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from autoglm_serve.config import CUDAGRAPH_MODES, EngineConfig
from autoglm_serve.help_formatter import DefaultsHelpFormatter
from autoglm_serve.server.reasoning import REASONING_PARSERS
from autoglm_serve.server.tool_parsers import TOOL_PARSERS
from autoglm_serve.structured.spec import BUILTIN_GRAMMARS

DEFAULT_MAX_BODY_MB = 50.0   # several 1080×2400 base64 PNG screenshots
GENERATION_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                   "max_new_tokens")


@dataclass
class ServerSettings:
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_names: list[str] = field(default_factory=list)
    api_key: str | None = None
    max_request_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20)
    max_waiting_requests: int = 4096
    max_n: int = 128
    trust_request_chat_template: bool = False
    max_queued_tokens: int | None = None      # None: see Serving
    reasoning_parser: str | None = None
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    default_structured_grammar: str | None = None   # e.g. autoglm_action, for every chat
    allowed_local_media_path: str | None = None
    uvicorn_log_level: str = "info"
    access_log: bool = False
    graceful_shutdown_timeout: float = 30.0
    use_generation_config: bool = True
    generation_overrides: dict = field(default_factory=dict)


# vLLM flags that deployment lines carry and that change nothing here: accepted, and logged at
# start-up with the reason, so a copied command line starts as it is.
NO_EFFECT = {
    "trust_remote_code": "autoglm-serve never runs model code from checkpoints",
    "mm_processor_cache_type": "the encoder cache lives in the engine's own process",
    "disable_log_requests": "requests are not logged",
    "disable_uvicorn_access_log": "the access log is off unless --enable-access-log",
}


def no_effect_notes(args: argparse.Namespace) -> list[str]:
    """One line per NO_EFFECT flag the command line set."""
    notes = []
    for dest, why in NO_EFFECT.items():
        value = getattr(args, dest, None)
        if value not in (None, False):
            flag = "--" + dest.replace("_", "-")
            shown = flag if value is True else f"{flag} {value}"
            notes.append(f"{shown}: accepted, no effect here ({why})")
    return notes


def normalize_argv(argv: list[str]) -> list[str]:
    """`--mm_processor_kwargs` → `--mm-processor-kwargs` (values are left alone)."""
    out = []
    for arg in argv:
        if arg.startswith("--") and "_" in arg.split("=", 1)[0]:
            name, sep, value = arg.partition("=")
            arg = name.replace("_", "-") + sep + value
        out.append(arg)
    return out


def _length(text: str) -> int:
    """'25480', '32k', '1m' (vLLM accepts the suffixed forms too)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kKmM]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a length: {text!r}")
    scale = {"": 1, "k": 1000, "K": 1024, "m": 10**6, "M": 2**20}[m.group(2)]
    return int(float(m.group(1)) * scale)


def _json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def _limit_mm(text: str) -> dict:
    """'{"image": 10}' (current vLLM) or 'image=10,video=0' (older vLLM)."""
    if text.strip().startswith("{"):
        return _json_dict(text)
    out = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"expected JSON or modality=count, got {text!r}")
        out[key.strip()] = int(value)
    return out


def add_serve_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="checkpoint directory, GGUF file, Hub id (owner/name) or name "
                        "(default: the embedded SmolLM2-135M-Instruct)")
    m = p.add_argument_group("model")
    m.add_argument("--model", default=None, help="same as MODEL")
    m.add_argument("--tokenizer", default=None)
    m.add_argument("--mmproj", default=None, metavar="FILE",
                   help="a GGUF vision model's vision-tower file (llama.cpp's mmproj-*.gguf); "
                        "default: the one mmproj*.gguf next to the model file")
    m.add_argument("--served-model-name", nargs="+", default=None,
                   help="names clients use in the `model` field (the first one is reported)")
    m.add_argument("--load-format", default="auto",
                   help="auto | safetensors | gguf | dummy")
    m.add_argument("--dtype", default="auto",
                   help="auto | bfloat16 | float16 | half | float32 | float")
    m.add_argument("--quantization", "-q", default=None,
                   help="awq | gptq | compressed-tensors (as the checkpoint's "
                        "quantization_config says; read from it when not given) | fp8 "
                        "(FP8 W8A8; on a 16-bit checkpoint: quantized at load)")
    m.add_argument("--hf-overrides", type=_json_dict, default={},
                   help='onto the model\'s Hugging Face config before it is built, e.g. '
                        '\'{"text_config": {"num_hidden_layers": 2}}\' (a sub-config\'s keys '
                        'are updated, any other key is replaced or added)')
    m.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for vLLM compatibility; no remote code is ever run")
    m.add_argument("--revision", default=None,
                   help="branch, tag or commit of a Hugging Face Hub model id")
    m.add_argument("--download-dir", default=None,
                   help="where a Hub model is kept (default: the Hugging Face cache)")
    m.add_argument("--chat-template", default=None, help="a Jinja file, or the template itself")
    m.add_argument("--trust-request-chat-template", action="store_true",
                   help="let requests bring their own chat_template (off: a template is code "
                        "that runs on the server; a crafted one loops for minutes)")
    m.add_argument("--chat-template-content-format", default="auto",
                   choices=["auto", "string", "openai"])
    m.add_argument("--generation-config", default="auto",
                   help="auto: sampling defaults from the model's generation_config.json; "
                        "vllm: ignore it")
    m.add_argument("--override-generation-config", type=_json_dict, default={},
                   help='sampling defaults over generation_config.json, e.g. '
                        '\'{"temperature": 0.5, "max_new_tokens": 512}\' (max_new_tokens: the '
                        'default max_tokens of chat requests)')
    m.add_argument("--reasoning-parser", default=None, choices=REASONING_PARSERS,
                   help="always split <think>…</think> into reasoning_content")
    m.add_argument("--enable-auto-tool-choice", action="store_true",
                   help="let the model decide to call tools (tool_choice auto); needs "
                        "--tool-call-parser")
    m.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS),
                   help="the model family's tool-call format, for tool_choice auto")
    m.add_argument("--default-structured-grammar", default=None, choices=BUILTIN_GRAMMARS,
                   help="constrain every chat completion without its own structured output "
                        "or tools to this grammar (autoglm_action: one Open-AutoGLM action "
                        "after free thinking)")
    e = p.add_argument_group("engine")
    e.add_argument("--max-model-len", type=_length, default=None)
    e.add_argument("--max-num-seqs", type=int, default=256)
    e.add_argument("--max-num-batched-tokens", type=int, default=None)
    e.add_argument("--decode-step-tokens", type=int, default=None,
                   help="the step's token budget while any request decodes (prompt chunks "
                        "and vision blocks fill what decodes leave): smaller keeps TPOT short "
                        "while prompts and screenshots wait (default: max-num-batched-tokens)")
    e.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=True)
    e.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=True)
    e.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    e.add_argument("--kv-cache-memory-gib", type=float, default=None,
                   help="KV-cache size (default: profiled on GPU, 2 GiB on CPU)")
    e.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3"],
                   help="fp8: the KV cache in float8 e4m3 (scale 1.0), half the bytes of bf16")
    e.add_argument("--num-gpu-blocks-override", type=int, default=None)
    e.add_argument("--block-size", type=int, default=16)
    e.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    e.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    e.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    e.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    e.add_argument("--cudagraph-mode", default="full_decode_only", type=str.lower,
                   choices=CUDAGRAPH_MODES,
                   help="full_decode_only: CUDA graphs for decode steps; full_and_piecewise: "
                        "also, split at attention, for steps with up to 1,024 prompt and "
                        "decode tokens (half their host time; ~0.4 GiB of the KV cache for "
                        "AutoGLM-Phone-9B) (vLLM's modes)")
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    e.add_argument("--attention-backend", default="auto", choices=["auto", "torch", "triton"])
    e.add_argument("--engine-process", action=argparse.BooleanOptionalAction, default=True,
                   help="run the engine core in its own process, so the HTTP side never "
                        "competes with it for the GIL; --no-engine-process: on a thread of the "
                        "server process (one process to debug; slower under many streams)")
    mm = p.add_argument_group("multimodal")
    mm.add_argument("--allowed-local-media-path", default=None,
                    help="directory whose files requests may name as file:// images")
    mm.add_argument("--allowed-media-domains", nargs="+", default=None,
                    help="hosts that http(s) images may come from")
    mm.add_argument("--limit-mm-per-prompt", type=_limit_mm, default={},
                    help='e.g. \'{"image": 10}\'')
    mm.add_argument("--mm-processor-kwargs", type=_json_dict, default={},
                    help='e.g. \'{"max_pixels": 5000000}\'')
    mm.add_argument("--mm-encoder-quantization", default=None, choices=["fp8"],
                    help="fp8: the vision tower's linear layers in FP8 W8A8 (default: 16-bit, "
                         "whatever --quantization says)")
    mm.add_argument("--mm-encoder-tp-mode", default="data", choices=["data", "weights"],
                    help="under --tensor-parallel-size: the vision tower replicated, each rank "
                         "encoding a share of the images (data), or sharded (weights)")
    mm.add_argument("--mm-processor-cache-type", default=None,
                    help="accepted for vLLM compatibility (our encoder cache is in-process)")
    s = p.add_argument_group("server")
    s.add_argument("--host", default="0.0.0.0")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--api-key", default=None, help="require `Authorization: Bearer KEY`")
    s.add_argument("--max-request-body-mb", type=float, default=DEFAULT_MAX_BODY_MB,
                   help="larger bodies are refused with 413 before being parsed")
    s.add_argument("--max-waiting-requests", type=int, default=4096,
                   help="sequences (n per prompt) beyond max_num_seqs + this are refused "
                        "with 503 and Retry-After")
    s.add_argument("--max-queued-tokens", type=int, default=None,
                   help="prompt tokens (n x prompt) the server holds in flight; beyond it 503 "
                        "with Retry-After (default: the most of 16 x the KV cache's tokens, "
                        "max-n x max-model-len and 4M)")
    s.add_argument("--max-n", type=int, default=128,
                   help="the largest n (and best_of) a request may ask for (OpenAI's is 128)")
    s.add_argument("--uvicorn-log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug", "trace"])
    s.add_argument("--enable-access-log", action="store_true",
                   help="log every HTTP request (off: it costs CPU under load)")
    s.add_argument("--disable-uvicorn-access-log", action="store_true",
                   help="accepted for vLLM compatibility (the access log is off by default)")
    s.add_argument("--disable-log-requests", action="store_true", help="accepted (vLLM)")
    s.add_argument("--disable-log-stats", action="store_true",
                   help="no periodic log line on the engine's pace")
    s.add_argument("--log-stats-interval", type=float, default=5.0,
                   help="seconds between the engine's log lines while it works")
    s.add_argument("--step-trace", default=None, metavar="PATH", dest="step_trace_path",
                   help="append a JSON line per engine step to PATH (its time, decode rows, "
                        "prompt tokens, vision-tower work, queue): for benchmarks and tuning")
    s.add_argument("--shutdown-timeout", "--graceful-shutdown-timeout", type=float,
                   default=30.0, dest="graceful_shutdown_timeout",
                   help="seconds in-flight requests get to finish after SIGTERM; those still "
                        "running then end with an error event")
    return p


def _read_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value).expanduser()
    if len(value) < 4096 and path.is_file():
        return path.read_text()
    if "{" not in value:  # neither a file nor a template: most likely a wrong path
        raise ValueError(f"--chat-template {value!r}: no such file, and not a Jinja template")
    return value


def _check_supported(args: argparse.Namespace) -> None:
    """Values we cannot honour stop the start, with the reason."""
    if args.quantization is not None:
        from autoglm_serve.quantization.config import check_method_name
        check_method_name(args.quantization)   # raises with the supported list
    if args.pipeline_parallel_size != 1 or args.data_parallel_size != 1:
        raise ValueError("pipeline/data parallelism is not supported yet: this build serves "
                         "on one GPU")
    if args.generation_config not in ("auto", "vllm"):
        raise ValueError(f"--generation-config {args.generation_config!r}: only 'auto' and "
                         "'vllm' are supported")
    if args.allowed_local_media_path is not None and \
            not Path(args.allowed_local_media_path).is_dir():
        raise ValueError(f"--allowed-local-media-path {args.allowed_local_media_path!r} is not "
                         "a directory")
    unknown = set(args.override_generation_config) - set(GENERATION_KEYS)
    if unknown:
        raise ValueError(f"--override-generation-config: unsupported keys {sorted(unknown)} "
                         f"(supported: {', '.join(GENERATION_KEYS)})")
    if args.max_request_body_mb <= 0:
        raise ValueError("--max-request-body-mb must be > 0")
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ValueError("--enable-auto-tool-choice needs --tool-call-parser")
    if args.max_waiting_requests < 0:
        raise ValueError("--max-waiting-requests must be >= 0")
    if args.max_n < 1:
        raise ValueError("--max-n must be >= 1")
    if args.max_queued_tokens is not None and args.max_queued_tokens < 1:
        raise ValueError("--max-queued-tokens must be >= 1")
    if not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port} is not a TCP port")


def model_from_args(args: argparse.Namespace) -> str | None:
    if args.model_tag and args.model and args.model_tag != args.model:
        raise ValueError(f"the model is given twice, differently: {args.model_tag!r} and "
                         f"--model {args.model!r}")
    return args.model_tag or args.model


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    _check_supported(args)
    return EngineConfig(
        model=model_from_args(args), revision=args.revision, download_dir=args.download_dir,
        tokenizer=args.tokenizer, mmproj=args.mmproj,
        load_format=args.load_format,
        dtype=args.dtype, device=args.device, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        decode_step_tokens=args.decode_step_tokens,
        enable_prefix_caching=args.enable_prefix_caching,
        enable_chunked_prefill=args.enable_chunked_prefill,
        gpu_memory_utilization=args.gpu_memory_utilization, block_size=args.block_size,
        kv_cache_memory_gib=args.kv_cache_memory_gib, num_kv_blocks=args.num_gpu_blocks_override,
        seed=args.seed, enforce_eager=args.enforce_eager, cudagraph_mode=args.cudagraph_mode,
        tensor_parallel_size=args.tensor_parallel_size,
        mm_encoder_tp_mode=args.mm_encoder_tp_mode, quantization=args.quantization,
        kv_cache_dtype=args.kv_cache_dtype, mm_encoder_quantization=args.mm_encoder_quantization,
        attention_backend=args.attention_backend, mm_processor_kwargs=args.mm_processor_kwargs,
        hf_overrides=args.hf_overrides,
        limit_mm_per_prompt=args.limit_mm_per_prompt,
        chat_template=_read_chat_template(args.chat_template),
        chat_template_content_format=args.chat_template_content_format,
        allowed_local_media_path=args.allowed_local_media_path,
        allowed_media_domains=tuple(args.allowed_media_domains or ()),
        log_stats_interval_s=None if args.disable_log_stats else args.log_stats_interval,
        step_trace_path=args.step_trace_path)


def default_served_name(model: str | None) -> str:
    if model is None:
        from autoglm_serve.loader.default_model import DEFAULT_MODEL_NAME
        return DEFAULT_MODEL_NAME
    return model


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    return ServerSettings(
        host=args.host, port=args.port,
        served_model_names=args.served_model_name or [default_served_name(model_from_args(args))],
        api_key=args.api_key, max_request_body_bytes=int(args.max_request_body_mb * 2**20),
        max_waiting_requests=args.max_waiting_requests, max_n=args.max_n,
        max_queued_tokens=args.max_queued_tokens,
        trust_request_chat_template=args.trust_request_chat_template,
        reasoning_parser=args.reasoning_parser,
        enable_auto_tool_choice=args.enable_auto_tool_choice,
        tool_call_parser=args.tool_call_parser,
        default_structured_grammar=args.default_structured_grammar,
        allowed_local_media_path=args.allowed_local_media_path,
        uvicorn_log_level=args.uvicorn_log_level, access_log=args.enable_access_log,
        graceful_shutdown_timeout=args.graceful_shutdown_timeout,
        use_generation_config=args.generation_config == "auto",
        generation_overrides=args.override_generation_config)


def build_parser(prog: str = "autoglm-serve serve") -> argparse.ArgumentParser:
    return add_serve_args(argparse.ArgumentParser(
        prog=prog, description="OpenAI-compatible server (vLLM's flags)",
        formatter_class=DefaultsHelpFormatter))
