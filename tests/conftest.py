import ctypes
import gc
import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A fixed CPU thread count (read by torch at import, inherited by the servers the tests start):
# the engine's adaptive count (engine/core/cpu_threads.py) follows the machine's load, and
# float32 matmuls can round differently at another thread count, which the exact equalities
# below (alone against batched, stream against non-stream) must not depend on. The servers of
# what a new user meets (embedded_server) and tests/test_cpu_threads.py run without it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Without a GPU, Triton kernels run in its interpreter (must be set before triton is imported).
import torch  # noqa: E402
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The run's own derived-files cache (autoglm_serve/derived_cache.py), shared by the servers it
# starts: the default model's tokenizer is converted once a run, not at every start, and
# nothing is written to the user's ~/.cache.
os.environ.setdefault("AUTOGLM_SERVE_CACHE_DIR", tempfile.mkdtemp(prefix="autoglm-serve-cache-"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs CUDA; skipped where there is none")
    config.addinivalue_line("markers", "slow: takes more than a few seconds")


def pytest_collection_modifyitems(config, items):
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


try:
    _malloc_trim = ctypes.CDLL(None).malloc_trim   # glibc
except (OSError, AttributeError):
    def _malloc_trim(pad: int) -> int:
        return 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After a module's fixtures are torn down, its models and engines are freed (they hold
    reference cycles) and the heap's free pages go back to the system: without it the run kept
    the 11.7 GB of test_quantize_quality's GPTQ calibration to its end, and CI, beside the servers
    later tests start, was killed for memory."""
    yield
    if nextitem is None or nextitem.module is not item.module:
        gc.collect()
        _malloc_trim(0)


@pytest.fixture
def triton_interpreter_fixes(monkeypatch):
    """The work-arounds for the Triton interpreter's bugs (tests/triton_interpreter_fixes.py),
    where kernels run in it; for a module: ``pytestmark = pytest.mark.usefixtures(...)``."""
    if not torch.cuda.is_available():
        from triton_interpreter_fixes import fix_interpreter
        fix_interpreter(monkeypatch)


@pytest.fixture(scope="session")
def default_llm():
    """The embedded default (SmolLM2-135M-Instruct), loaded once for the whole run."""
    from autoglm_serve import LLM
    return LLM(max_model_len=2048)


@pytest.fixture(scope="session")
def default_llm_float32():
    """The embedded default in float32, for tests of exact equalities (with transformers in
    float32, alone against batched): on a CPU with native bf16 the default runs bf16 with 4-bit
    decode linears for a few rows and dense bf16 for more, whose rounding differs by batch."""
    from autoglm_serve import LLM
    return LLM(dtype="float32", max_model_len=2048, num_kv_blocks=256)


@pytest.fixture(scope="session")
def embedded_server():
    """A real server on the embedded default, as a new user starts it (no flags), shared by the
    tests of what a user meets first: the guides' snippet, the dashboard, the notebook."""
    from tests.server_fixtures import server_fixture
    yield from server_fixture([], env={"OMP_NUM_THREADS": None})   # adaptive, as a user's
