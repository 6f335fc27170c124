"""The offline API: ``LLM(model).generate(prompts, params)`` and ``.chat(messages, params)``."""
from __future__ import annotations

from collections.abc import Sequence

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.llm_engine import LLMEngine
from autoglm_serve.engine.core.model_setup import LoadedModel
from autoglm_serve.engine.settings import resolve_settings
from autoglm_serve.outputs import RequestOutput
from autoglm_serve.sampling_params import SamplingParams

# a string, token ids, or vLLM's dict form:
# {"prompt" | "prompt_token_ids": ..., "multi_modal_data": {"image": PIL image or list}}
Prompt = str | list[int] | dict


class LLM:
    def __init__(self, model: str | None = None, loaded: LoadedModel | None = None, **kwargs):
        """loaded: weights already in memory (another LLM's ``engine.core.loaded``), so tests
        and tools can try other engine settings without loading the checkpoint again."""
        config = EngineConfig(model=model, **kwargs)
        self.engine = LLMEngine(resolve_settings(config, loaded.resolved if loaded else None,
                                                 offline=True), loaded)

    @property
    def tokenizer(self):
        return self.engine.frontend.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """The checkpoint's generation_config.json sampling defaults, as the server applies
        them (vLLM's LLM does the same); its max_new_tokens is max_tokens."""
        defaults = dict(self.engine.frontend.generation_defaults)
        if "max_new_tokens" in defaults:
            defaults["max_tokens"] = defaults.pop("max_new_tokens")
        return SamplingParams(**defaults)

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = sampling_params or self.get_default_sampling_params()
        params_list = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("give one SamplingParams, or one per prompt")
        return self._run([(lambda p=p: self._prepare(p), sp) for p, sp in zip(prompts, params_list)])

    def _prepare(self, prompt: Prompt):
        if not isinstance(prompt, dict):
            return self.engine.frontend.prepare(prompt)
        images = (prompt.get("multi_modal_data") or {}).get("image") or []
        if not isinstance(images, (list, tuple)):
            images = [images]
        text = prompt.get("prompt", prompt.get("prompt_token_ids"))
        if text is None:
            raise ValueError("a dict prompt needs 'prompt' or 'prompt_token_ids'")
        return self.engine.frontend.prepare(text, images)

    def chat(self, messages: list[dict] | list[list[dict]],
             sampling_params: SamplingParams | None = None,
             chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """OpenAI-style messages, image_url parts included (data:, file:// inside
        allowed_local_media_path, http(s) of allowed_media_domains)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        params = sampling_params or self.get_default_sampling_params()
        return self._run([(lambda c=c: self.engine.frontend.prepare_chat(
            c, template_kwargs=chat_template_kwargs), params)
                          for c in conversations])

    def _run(self, items) -> list[RequestOutput]:
        engine = self.engine
        ids = []
        try:
            for prepare, params in items:
                prompt = prepare()
                rid = engine.frontend.next_request_id()
                engine.add_request(rid, prompt, params, final_only=True)
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

    def shutdown(self) -> None:
        """Stops the tensor-parallel workers, if any (they also stop when this process ends)."""
        self.engine.shutdown()
