"""The synchronous engine: input processing, the core, output processing, in one loop.

The offline ``LLM`` drives it directly; the server runs the core on its own thread instead
(server/async_engine.py) with the same input and output processors.
"""
from __future__ import annotations

import itertools

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.core import EngineCore
from autoglm_serve.engine.input_processor import InputProcessor
from autoglm_serve.engine.output_processor import OutputProcessor
from autoglm_serve.engine.model_setup import text_config
from autoglm_serve.outputs import RequestOutput
from autoglm_serve.sampling_params import SamplingParams
from autoglm_serve.tokenizer import load_tokenizer


def eos_ids(tokenizer, hf_config, resolved) -> set[int]:
    ids: set[int] = set()
    for src in (text_config(hf_config), hf_config):
        eos = getattr(src, "eos_token_id", None)
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(eos)
    gen = resolved.path / "generation_config.json" if resolved.path.is_dir() else None
    if gen is not None and gen.is_file():
        import json
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


class LLMEngine:
    def __init__(self, config: EngineConfig):
        self.config = config
        self.core = EngineCore(config)
        loaded = self.core.loaded
        self.tokenizer = None if config.skip_tokenizer_init else \
            load_tokenizer(loaded.resolved.path, config.tokenizer)
        if config.chat_template and self.tokenizer is not None:
            self.tokenizer.chat_template = config.chat_template
        self.input_processor = InputProcessor(
            self.tokenizer, self.core.max_model_len, self.core.vocab_size,
            eos_ids(self.tokenizer, loaded.hf_config, loaded.resolved), self.core.device,
            loaded.generation_defaults)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._ids = itertools.count()

    def next_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams,
                    add_special_tokens: bool = True, delta: bool = False, mm_items=(),
                    mrope=None) -> None:
        token_ids = self.input_processor.tokenize(prompt, add_special_tokens)
        requests = self.input_processor.make_requests(request_id, token_ids, params, mm_items,
                                                      mrope)
        self.output_processor.add(request_id, prompt if isinstance(prompt, str) else None,
                                  requests, delta)
        for r in requests:
            self.core.add_request(r)

    def abort(self, request_id: str) -> None:
        self.core.abort(self.output_processor.abort(request_id))

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def step(self) -> list[RequestOutput]:
        outputs, to_abort = self.output_processor.process(self.core.step())
        if to_abort:
            self.core.abort(to_abort)
        return outputs
