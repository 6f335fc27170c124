"""autoglm-serve: an inference engine and OpenAI-compatible server for AutoGLM-Phone-9B."""
import os

# Before any CUDA allocation: expandable segments keep the caching allocator from stranding
# memory in blocks of the wrong size. On a 24 GB card 0.64 GiB sat reserved but unallocated
# when a step ran out of memory; the KV cache is sized to the byte, so it must not be lost.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

from autoglm_serve.sampling_params import SamplingParams  # noqa: E402

__version__ = "0.1.0"


def __getattr__(name):
    # LLM pulls in torch and transformers: import it only when asked for.
    if name == "LLM":
        from autoglm_serve.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "__version__"]
