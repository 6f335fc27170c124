"""A warning for every Triton kernel compiled once the engine serves, or inside a CUDA-graph
capture.

Start-up compiles every kernel variant that serving should need (self-checks, the eager pass
before each capture, warm-up). A compile later stalls the whole batch for up to a second or
more, and it means a kernel argument is specialized on something the traffic changes (an
integer's value class, a pointer's alignment): the fix is ``do_not_specialize`` or a wider
warm-up, and this log says which kernel and signature to look at. A compile inside a capture
can invalidate it (seen with a cold Triton cache): the eager pass before it missed a variant.
"""
from __future__ import annotations

import contextlib
import logging
import time

import triton

logger = logging.getLogger(__name__)

_started: dict = {}
SERVING = "while serving, a stall for every running request"
CAPTURING = "while capturing a CUDA graph, which it can invalidate"
_during = [SERVING]   # what a compile now interrupts, for the warning


def _before_compile(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    _started[str(key)] = time.perf_counter()
    return False   # True would skip the compile


def _specialization(fn, compile) -> str:
    """The values a variant is compiled for: constexprs (and integers specialized to
    constants), and the arguments assumed divisible by 16 (pointers: 16-byte aligned)."""
    names = fn.jit_function.arg_names
    parts = [f"{names[path[0]]}={value}" for path, value in compile["constants"].items()]
    for path, attrs in (compile["configs"] or [{}])[0].items():
        parts += [f"{names[path[0]]}:{name.removeprefix('tt.')}={value}" for name, value in attrs]
    return ", ".join(parts)


def _after_compile(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    t0 = _started.pop(str(key), None)
    seconds = time.perf_counter() - t0 if t0 is not None else float("nan")
    try:
        what = _specialization(fn, compile)
    except Exception:   # a Triton version with other hook fields: never fail the launch
        what = repr
    logger.warning("Triton kernel %s compiled %s (%.2f s) for %s", fn.name, _during[0], seconds,
                   what)


def watch(on: bool = True) -> None:
    """From now on, log each compile (an engine's start-up ends with this), or stop (another
    engine's start-up in the same process begins with ``watch(False)``)."""
    triton.knobs.runtime.jit_cache_hook = _before_compile if on else None
    triton.knobs.runtime.jit_post_compile_hook = _after_compile if on else None


@contextlib.contextmanager
def watching(during: str):
    """Logs each compile within as one made ``during`` (e.g. "while capturing a CUDA graph");
    the watch is as before afterwards."""
    was = (_during[0], triton.knobs.runtime.jit_cache_hook,
           triton.knobs.runtime.jit_post_compile_hook)
    _during[0] = during
    watch()
    try:
        yield
    finally:
        (_during[0], triton.knobs.runtime.jit_cache_hook,
         triton.knobs.runtime.jit_post_compile_hook) = was
