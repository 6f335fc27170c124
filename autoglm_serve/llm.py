"""The offline API: ``LLM(model).generate(prompts, params)`` and ``.chat(messages, params)``."""
from __future__ import annotations

from collections.abc import Sequence

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.llm_engine import LLMEngine
from autoglm_serve.outputs import RequestOutput
from autoglm_serve.sampling_params import SamplingParams

Prompt = str | list[int]


class LLM:
    def __init__(self, model: str | None = None, **kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or SamplingParams()
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        return self._run([(p, sp, True) for p, sp in zip(prompts, params_list)])

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | None = None,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        params = sampling_params or SamplingParams()
        prompts = [self.apply_chat_template(c, chat_template_kwargs) for c in conversations]
        return self._run([(p, params, False) for p in prompts])

    def apply_chat_template(self, messages: list[dict], chat_template_kwargs: dict | None = None
                            ) -> str:
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; pass chat_template")
        return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True,
                                                  **(chat_template_kwargs or {}))

    def _run(self, items) -> list[RequestOutput]:
        engine = self.engine
        ids = []
        try:
            for prompt, params, special in items:
                rid = engine.next_request_id()
                engine.add_request(rid, prompt, params, add_special_tokens=special)
                ids.append(rid)
        except Exception:
            for rid in ids:   # a bad prompt fails the call, not the engine
                engine.abort(rid)
            raise
        finished: dict[str, RequestOutput] = {}
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = out
        return [finished[r] for r in ids]
