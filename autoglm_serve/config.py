"""Engine settings in one place; the CLI and the offline API map onto EngineConfig."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

_DTYPES = {"float32": torch.float32, "float": torch.float32, "fp32": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16, "fp16": torch.float16}

CUDAGRAPH_MODES = ("full_and_piecewise", "full_decode_only")
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")


@dataclass
class EngineConfig:
    model: str | None = None                  # None: the embedded default (SmolLM2-135M-Instruct)
    revision: str | None = None               # of a Hugging Face Hub id given as model
    download_dir: str | None = None           # a Hub model's cache (default: Hugging Face's)
    tokenizer: str | None = None
    mmproj: str | None = None                 # a GGUF vision model's vision-tower file (llama.cpp's)
    skip_tokenizer_init: bool = False         # token-id prompts only; no text in outputs
    load_format: str = "auto"                 # auto | safetensors | gguf | dummy
    dtype: str = "auto"
    device: str = "auto"                      # auto | cpu | cuda
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    decode_step_tokens: int | None = None     # the step's budget while any request decodes
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    gpu_memory_utilization: float = 0.9
    block_size: int = 16
    kv_cache_memory_gib: float | None = None  # explicit KV budget (CPU default: 2 GiB)
    num_kv_blocks: int | None = None          # exact block count (tests, tuning)
    seed: int = 0
    enforce_eager: bool = False
    # CUDA graphs with the Triton backend (vLLM's modes): full_decode_only, whole graphs for
    # decode-only steps; full_and_piecewise, also graphs split at attention for steps with
    # prompt tokens (engine/core/prompt_graphs.py: less host time a step, ~0.4 GiB more)
    cudagraph_mode: str = "full_decode_only"
    async_scheduling: bool | None = None      # prepare step N+1 while the device runs step N;
                                              # None: on a GPU only
    tensor_parallel_size: int = 1             # ranks, one process and device each
    mm_encoder_tp_mode: str = "data"          # vision tower under TP: data | weights
    quantization: str | None = None           # awq | gptq | compressed-tensors | fp8 (vLLM's)
    kv_cache_dtype: str = "auto"              # auto (the model dtype) | fp8 (e4m3, scale 1.0)
    mm_encoder_quantization: str | None = None  # fp8: the vision tower's linears in FP8 W8A8
    attention_backend: str = "auto"           # auto | torch | triton
    mm_processor_kwargs: dict = field(default_factory=dict)
    hf_overrides: dict = field(default_factory=dict)   # onto the model's config (vLLM's)
    limit_mm_per_prompt: dict = field(default_factory=dict)
    chat_template: str | None = None
    chat_template_content_format: str = "auto"    # auto | string | openai (vLLM's)
    allowed_local_media_path: str | None = None   # file:// images only from inside this folder
    allowed_media_domains: tuple[str, ...] = ()   # http(s) images only from these hosts
    log_stats_interval_s: float | None = None     # the server's periodic engine log line
    step_trace_path: str | None = None            # a JSON line per engine step (server)

    def __post_init__(self):
        if self.load_format not in ("auto", "safetensors", "gguf", "dummy"):
            raise ValueError(f"load_format must be auto, safetensors, gguf or dummy, "
                             f"not {self.load_format!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda, not {self.device!r}")
        if self.dtype != "auto" and self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be auto or one of {sorted(_DTYPES)}, not {self.dtype!r}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1]")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens is not None and self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")
        if self.decode_step_tokens is not None and self.decode_step_tokens < 1:
            raise ValueError("decode_step_tokens must be >= 1")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError("block_size must be one of 8, 16, 32, 64, 128")
        if self.tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be >= 1")
        if self.mm_encoder_tp_mode not in ("data", "weights"):
            raise ValueError(f"mm_encoder_tp_mode must be data or weights, not "
                             f"{self.mm_encoder_tp_mode!r}")
        if self.quantization is not None:
            from autoglm_serve.quantization.config import check_method_name
            check_method_name(self.quantization)
        if self.mm_encoder_quantization not in (None, "fp8"):
            raise ValueError(f"mm_encoder_quantization must be fp8 (or unset), not "
                             f"{self.mm_encoder_quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"not {self.kv_cache_dtype!r}")
        if self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise ValueError(f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, not "
                             f"{self.cudagraph_mode!r}")
        if self.attention_backend not in ("auto", "torch", "triton"):
            raise ValueError("attention_backend must be auto, torch or triton")

    def resolve_device(self) -> torch.device:
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError("device='cuda' was asked for but CUDA is not available")
        return torch.device(self.device)

    def resolve_async_scheduling(self, device: torch.device) -> bool:
        """On by default where a device runs the step while the host prepares the next. A CPU
        runs the step in the host's own thread: nothing overlaps, and each token would only
        reach its client one step late (a step is ~80 ms for the embedded default on 2 cores)."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        return device.type == "cuda"

    def resolve_kv_cache_dtype(self, model_dtype: torch.dtype) -> torch.dtype:
        """fp8: e4m3 with a scale of 1.0 (vLLM's default without calibrated scales): K and V
        stay far inside e4m3's +-448, and each value keeps 3 mantissa bits."""
        return torch.float8_e4m3fn if self.kv_cache_dtype.startswith("fp8") else model_dtype

    def resolve_dtype(self, hf_config, device: torch.device) -> torch.dtype:
        if self.dtype != "auto":
            return _DTYPES[self.dtype]
        if device.type == "cpu":
            # bf16 where the CPU computes it natively (AVX512-BF16/AMX), as vLLM's CPU backend
            # does: half the bytes per weight and KV element; elsewhere bf16 matmuls are slow
            return torch.bfloat16 if torch.cpu._is_avx512_bf16_supported() else torch.float32
        dtype = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
        if isinstance(dtype, str):
            dtype = _DTYPES.get(dtype)
        return dtype if dtype in (torch.bfloat16, torch.float16) else torch.bfloat16
