"""Module paths that mirror vLLM's, so `python -m vllm.entrypoints...` lines port by renaming."""
