"""autoglm-serve: an inference engine and OpenAI-compatible server for AutoGLM-Phone-9B."""
from autoglm_serve.sampling_params import SamplingParams

__version__ = "0.1.0"


def __getattr__(name):
    # LLM pulls in torch and transformers: import it only when asked for.
    if name == "LLM":
        from autoglm_serve.llm import LLM
        return LLM
    raise AttributeError(name)


__all__ = ["LLM", "SamplingParams", "__version__"]
