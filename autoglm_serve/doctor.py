"""`autoglm-serve doctor`: is this machine ready to serve the given model? Each check prints
✓ (fine), ! (works, but worth knowing) or ✗ (the server would fail) with how to fix it; the exit
status is 1 when any check failed, so scripts/run_autoglm_server.sh can stop before a slow load."""
from __future__ import annotations

import argparse
import os
import platform
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

MIN_PYTHON = (3, 11)
CUDA_TORCH_HINT = "pip install torch --index-url https://download.pytorch.org/whl/cu128"
GIB = 2**30


@dataclass
class Finding:
    level: str          # "ok" | "warn" | "fail"
    what: str
    fix: str = ""

    def lines(self) -> list[str]:
        mark = {"ok": "✓", "warn": "!", "fail": "✗"}[self.level]
        return [f"{mark} {self.what}"] + ([f"  fix: {self.fix}"] if self.fix else [])


def check_python() -> list[Finding]:
    version = ".".join(map(str, sys.version_info[:3]))
    where = sys.executable
    if sys.version_info[:2] < MIN_PYTHON:
        return [Finding("fail", f"Python {version} ({where}) is older than 3.11",
                        "install Python >= 3.11 and run scripts/setup.sh with it")]
    in_venv = sys.prefix != sys.base_prefix
    return [Finding("ok", f"Python {version} ({where}{', a virtualenv' if in_venv else ''})")]


def check_torch() -> tuple[list[Finding], bool]:
    """The findings, and whether CUDA is usable."""
    try:
        import torch
    except ImportError as exc:
        return [Finding("fail", f"torch is not importable ({exc})",
                        "run scripts/setup.sh (CPU) or install a CUDA torch first: "
                        + CUDA_TORCH_HINT)], False
    threads = torch.get_num_threads()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    found = [Finding("ok", f"torch {torch.__version__}, {threads} CPU threads on {cores} cores")]
    if torch.version.cuda is None:
        found.append(Finding("warn", "this torch is a CPU-only build: the server runs on the CPU "
                             "(fine for the embedded default, far too slow for a 9B model)",
                             "for a GPU: " + CUDA_TORCH_HINT))
        return found, False
    if not torch.cuda.is_available():
        found.append(Finding("fail", f"torch is built for CUDA {torch.version.cuda} but sees no "
                             "usable GPU",
                             "check nvidia-smi; the driver must support this CUDA version "
                             "(nvidia-smi shows the highest it supports), and "
                             "CUDA_VISIBLE_DEVICES must name a GPU"))
        return found, False
    found.append(Finding("ok", f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)"))
    return found, True


def gpu_memory() -> list[tuple[int, str, int, int]]:
    """(index, name, free bytes, total bytes) per visible GPU: NVML when nvidia-ml-py is there
    (it sees other processes' memory too), torch otherwise."""
    import torch
    try:
        import pynvml
        pynvml.nvmlInit()
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            name = pynvml.nvmlDeviceGetName(h)
            out.append((i, name.decode() if isinstance(name, bytes) else name, mem.free,
                        mem.total))
        if out:
            return out
    except Exception:   # no nvidia-ml-py, or NVML unusable: torch can still tell
        pass
    out = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        out.append((i, torch.cuda.get_device_name(i), free, total))
    return out


def check_gpus(weight_bytes: int | None) -> list[Finding]:
    found = []
    need = int(weight_bytes * 1.25) + GIB if weight_bytes else None  # weights + KV + activations
    for index, name, free, total in gpu_memory():
        what = f"GPU {index}: {name}, {free / GIB:.1f} of {total / GIB:.1f} GiB free"
        if need is not None and free < need:
            found.append(Finding("fail", what + f" (the model needs about {need / GIB:.1f} GiB)",
                                 "stop the other processes on it (nvidia-smi lists them), pick "
                                 "another GPU with CUDA_VISIBLE_DEVICES, or lower "
                                 "--max-model-len / --gpu-memory-utilization"))
        else:
            found.append(Finding("ok", what))
    return found


def check_triton(cuda: bool) -> list[Finding]:
    try:
        import triton
    except ImportError:
        if cuda:
            return [Finding("fail", "Triton is not installed (the GPU kernels need it)",
                            "pip install -e '.[gpu]'")]
        return [Finding("ok", "Triton not installed (not needed on the CPU)")]
    return [Finding("ok", f"Triton {triton.__version__}")]


def check_cpu_kernel() -> list[Finding]:
    """The C kernel that float32 CPU linears use for GGUF blocks (kernels/cpu/gguf_block_gemm.py)."""
    from autoglm_serve.kernels.cpu import gguf_block_gemm
    if gguf_block_gemm.available():
        return [Finding("ok", "CPU kernel for GGUF Q4_1/Q8_0 weights built (C compiler, AVX2)")]
    return [Finding("warn", "no C compiler or no AVX2: GGUF Q4_1/Q8_0 weights decode as dense "
                    "float32 (about 1.4x slower on the embedded default)",
                    "install gcc (apt-get install gcc) or set CC to a C compiler")]


def _weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(path.glob("*.safetensors"))


def check_model(model: str | None, tokenizer: str | None) -> tuple[list[Finding], int | None]:
    """The findings, and the weights' size in bytes (None when they cannot be found)."""
    from autoglm_serve.loader.model_path import resolve_model_path
    from autoglm_serve.tokenizer import _TOKENIZER_FILES
    try:
        resolved = resolve_model_path(model, download=False)   # a check fetches nothing
    except (FileNotFoundError, ValueError) as exc:
        return [Finding("fail", f"model: {exc}",
                        "give the checkpoint directory (the one with config.json and "
                        "*.safetensors) or a .gguf file; download AutoGLM-Phone-9B with: "
                        "hf download zai-org/AutoGLM-Phone-9B (or let `serve "
                        "zai-org/AutoGLM-Phone-9B` fetch it at start, ~20 GB)")], None
    name = "the embedded default" if model is None else str(resolved.path)
    arch = ", ".join(getattr(resolved.config, "architectures", None) or
                     [resolved.config.model_type])
    if resolved.format == "dir-config-only":
        return [Finding("fail", f"model {name} ({arch}) has config.json but no weights",
                        "the download is incomplete: fetch the *.safetensors files (and "
                        "model.safetensors.index.json) again")], None
    found = []
    if resolved.format == "safetensors":
        from autoglm_serve.loader.safetensors_loader import safetensors_files
        try:
            files = safetensors_files(resolved.path)
        except FileNotFoundError as exc:
            return [Finding("fail", f"model {name}: {exc}", "download the missing shards "
                            "again (huggingface-cli download resumes)")], None
    else:
        files = _weight_files(resolved.path)
    size = sum(f.stat().st_size for f in files)
    found.append(Finding("ok", f"model {name}: {arch}, {resolved.format}, {len(files)} weight "
                         f"file(s), {size / GIB:.2f} GiB"))
    tok_dir = Path(tokenizer).expanduser() if tokenizer else resolved.path
    if tok_dir.is_dir() and not any((tok_dir / f).is_file() for f in _TOKENIZER_FILES):
        found.append(Finding("fail", f"no tokenizer files in {tok_dir}",
                             f"copy the checkpoint's {' / '.join(_TOKENIZER_FILES)} there, or "
                             "pass --tokenizer DIR"))
    from autoglm_serve.models.registry import resolve_model_class
    try:
        cls = resolve_model_class(resolved.config)
    except ValueError as exc:
        found.append(Finding("fail", str(exc), "serve one of the supported architectures"))
    else:
        if hasattr(cls, "embed_images") and resolved.path.is_dir() \
                and not (resolved.path / "preprocessor_config.json").is_file():
            found.append(Finding("warn", "no preprocessor_config.json: images are processed "
                                 "with GLM-4.1V's defaults", "copy it from the checkpoint"))
    return found, size


def check_port(host: str, port: int) -> list[Finding]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return [Finding("fail", f"cannot listen on {host}:{port} ({exc.strerror or exc})",
                            f"stop what listens there (ss -ltnp | grep :{port}) or choose "
                            "another --port")]
    return [Finding("ok", f"port {port} on {host} is free")]


def run_checks(model: str | None, host: str, port: int, tokenizer: str | None = None
               ) -> list[Finding]:
    import autoglm_serve
    found = [Finding("ok", f"autoglm-serve {autoglm_serve.__version__} on {platform.platform()}")]
    found += check_python()
    torch_found, cuda = check_torch()
    found += torch_found
    if any(f.level == "fail" for f in torch_found) and not cuda and \
            "torch is not importable" in torch_found[0].what:
        return found + check_port(host, port)   # nothing else can be looked at without torch
    model_found, weight_bytes = check_model(model, tokenizer)
    if cuda:
        found += check_gpus(weight_bytes)
    else:
        found.append(Finding("ok", "no GPU in use: serving on the CPU"))
        found += check_cpu_kernel()
    found += check_triton(cuda)
    found += model_found
    found += check_port(host, port)
    return found


def add_doctor_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="model path or .gguf file (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--model", default=None, help="same as MODEL")
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    return p


def run_doctor(args: argparse.Namespace) -> int:
    findings = run_checks(args.model_tag or args.model, args.host, args.port, args.tokenizer)
    for f in findings:
        print("\n".join(f.lines()))
    failed = sum(f.level == "fail" for f in findings)
    warned = sum(f.level == "warn" for f in findings)
    if failed:
        print(f"{failed} problem(s) to fix before serving.")
        return 1
    print("ready to serve" + (f" ({warned} note(s) above)" if warned else "") + ".")
    return 0
