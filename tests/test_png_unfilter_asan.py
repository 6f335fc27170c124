"""kernels/cpu/png_unfilter.c reads scanlines that come from the network: built with
AddressSanitizer, it stays inside its buffers on random images of every filter type (and
undefined ones), at widths where its 4-byte loads and stores meet a row's end."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoglm_serve.kernels.cpu import build

SOURCE = Path(build.__file__).with_name("png_unfilter.c")

HARNESS = r"""
import ctypes, sys
import numpy as np
f = ctypes.CDLL(sys.argv[1]).png_unfilter_rgb
f.restype = ctypes.c_int
f.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p,
              ctypes.c_void_p]
rng = np.random.default_rng(1)
decoded = 0
for trial in range(1500):
    bpp = 3 + trial % 2
    w, h = int(rng.integers(1, 70)), int(rng.integers(1, 9))
    rows = rng.integers(0, 256, (h, 1 + w * bpp), dtype=np.uint8)
    rows[:, 0] = rng.integers(0, 6, h)              # 5: a type PNG does not define
    # buffers of exactly their sizes, from malloc (PYTHONMALLOC=malloc), for the sanitizer
    data = ctypes.create_string_buffer(rows.tobytes(), h * (1 + w * bpp))
    out = ctypes.create_string_buffer(h * w * 3)
    scratch = ctypes.create_string_buffer(2 * w * bpp)
    decoded += f(ctypes.addressof(data), h, w, bpp, ctypes.addressof(out),
                 ctypes.addressof(scratch)) >= 0
print("decoded", decoded)
"""


def _libasan(cc: str) -> str | None:
    path = subprocess.run([cc, "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def test_png_unfilter_stays_in_its_buffers(tmp_path):
    cc = build.compiler()
    libasan = cc and _libasan(cc)
    if not libasan:
        pytest.skip("no gcc with AddressSanitizer here")
    library = tmp_path / "png_unfilter_asan.so"
    subprocess.run([cc, "-O1", "-g", "-fsanitize=address",
                    "-fno-omit-frame-pointer", "-mavx2", "-fPIC", "-shared", "-o", str(library),
                    str(SOURCE)], check=True, capture_output=True)
    r = subprocess.run([sys.executable, "-c", HARNESS, str(library)], capture_output=True,
                       text=True, timeout=300,
                       env={**os.environ, "LD_PRELOAD": libasan, "PYTHONMALLOC": "malloc",
                            "ASAN_OPTIONS": "detect_leaks=0"})
    assert r.returncode == 0 and "AddressSanitizer" not in r.stderr, r.stderr[-3000:]
    assert int(r.stdout.split()[-1]) > 500      # most images decode; undefined types refuse
