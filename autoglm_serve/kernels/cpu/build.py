"""Builds this folder's C kernels with the machine's C compiler at first use and loads them.

Each `NAME.c` becomes a shared library compiled for AVX2 and FMA with OpenMP (the same libgomp
that torch loaded, so both share one thread pool) and without FMA contraction (the kernels say
where they round). Libraries are kept in the derived-files cache (derived_cache.py), keyed by the
source, this folder's headers and the compiler's version. Without a compiler ($CC, else gcc) or
AVX2 a kernel is simply not available and its callers keep their other path (PyTorch's,
libspng's).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from autoglm_serve import derived_cache

log = logging.getLogger(__name__)

FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-ffp-contract=off", "-fPIC", "-shared"]


def compiler() -> str | None:
    """The machine's C compiler: $CC, else gcc, or None."""
    return shutil.which(os.environ.get("CC", "gcc"))


def _cpu_has_avx2() -> bool:
    return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")


def _compile(compiler: str, source: Path, folder: Path) -> None:
    subprocess.run([compiler, *FLAGS, "-o", str(folder / f"{source.stem}.so"), str(source), "-lm"],
                   check=True, capture_output=True, text=True)


@functools.cache
def load(name: str) -> ctypes.CDLL | None:
    """The library built from NAME.c in this folder, or None where it cannot be built here."""
    cc = compiler()
    if cc is None or not _cpu_has_avx2():
        return None
    source = Path(__file__).with_name(f"{name}.c")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 check=True).stdout.splitlines()[0]
        headers = sorted(source.parent.glob("*.h"))
        entry = derived_cache.entry_path("cpu-kernels", [source, *headers], f"{version} {FLAGS}")
        if not (entry.is_dir()
                or derived_cache.publish(entry, lambda folder: _compile(cc, source, folder))):
            entry = Path(tempfile.mkdtemp(prefix="autoglm-cpu-kernels-"))
            _compile(cc, source, entry)
        return ctypes.CDLL(str(entry / f"{name}.so"))
    except (OSError, subprocess.CalledProcessError) as exc:
        log.warning("CPU kernel %s not built, its callers' other path runs instead: %s", name,
                    getattr(exc, "stderr", "") or exc)
        return None
