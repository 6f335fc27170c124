"""The synchronous engine: input processing, the core, output processing, in one loop.

The offline ``LLM`` drives it directly; the server runs the core on its own thread instead
(server/async_engine.py) with the same input and output processors.
"""
from __future__ import annotations

import itertools

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.core import EngineCore
from autoglm_serve.engine.input_processor import InputProcessor, PreparedPrompt
from autoglm_serve.engine.output_processor import OutputProcessor
from autoglm_serve.engine.model_setup import LoadedModel, text_config
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
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None):
        self.config = config
        self.core = EngineCore(config, loaded)
        loaded = self.core.loaded
        self.tokenizer = None if config.skip_tokenizer_init else self._load_tokenizer(loaded)
        if config.chat_template and self.tokenizer is not None:
            self.tokenizer.chat_template = config.chat_template
        self.input_processor = InputProcessor(
            self.tokenizer, self.core.max_model_len, self.core.vocab_size,
            eos_ids(self.tokenizer, loaded.hf_config, loaded.resolved), self.core.device,
            loaded.generation_defaults)
        self.output_processor = OutputProcessor(self.tokenizer)
        self.mm_processor = None
        if hasattr(loaded.model, "embed_images"):
            from autoglm_serve.multimodal.media import MediaPolicy
            from autoglm_serve.multimodal.processor import MultiModalProcessor
            path = loaded.resolved.path
            self.mm_processor = MultiModalProcessor(
                loaded.hf_config, path if path.is_dir() else None, config.mm_processor_kwargs,
                config.limit_mm_per_prompt,
                MediaPolicy(local_media_dir=config.allowed_local_media_path,
                            allowed_domains=tuple(config.allowed_media_domains)),
                device=self.core.device)
        self._ids = itertools.count()

    def _load_tokenizer(self, loaded):
        from autoglm_serve.engine.model_setup import is_builtin
        if self.config.tokenizer is None and is_builtin(loaded.resolved.path):
            # the packaged architecture has no tokenizer files: GLM's special tokens and chat
            # template over byte-level text (models/configs/glm_tokenizer.py)
            from autoglm_serve.models.configs.glm_tokenizer import byte_level_glm_tokenizer
            return byte_level_glm_tokenizer()
        return load_tokenizer(loaded.resolved.path, self.config.tokenizer)

    @property
    def model_name(self) -> str:
        return str(self.config.model or "SmolLM2-135M-Instruct")

    def prepare(self, prompt: str | list[int], images=(), add_special_tokens: bool = True
                ) -> PreparedPrompt:
        """Tokenizes; with images, expands their placeholders and builds M-RoPE positions."""
        token_ids = self.input_processor.tokenize(prompt, add_special_tokens)
        text = prompt if isinstance(prompt, str) else None
        if not images:
            return PreparedPrompt(token_ids, text)
        if self.mm_processor is None:
            raise ValueError(f"model {self.model_name} does not accept image input")
        mm = self.mm_processor.build(token_ids, list(images))
        return PreparedPrompt(mm.token_ids, text, mm.items, mm.mrope)

    def render_chat(self, messages: list[dict], chat_template_kwargs: dict | None = None
                    ) -> tuple[str, list[str]]:
        """The chat template applied (image parts reduced to markers) and the image URLs."""
        from autoglm_serve.multimodal.processor import split_images
        if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("this model's tokenizer has no chat template; pass chat_template")
        rendered, urls = split_images(messages)
        if urls and self.mm_processor is None:
            raise ValueError(f"model {self.model_name} does not accept image input")
        text = self.tokenizer.apply_chat_template(rendered, tokenize=False,
                                                  add_generation_prompt=True,
                                                  **(chat_template_kwargs or {}))
        return text, urls

    def prepare_chat(self, messages: list[dict], chat_template_kwargs: dict | None = None
                     ) -> PreparedPrompt:
        text, urls = self.render_chat(messages, chat_template_kwargs)
        images = self.mm_processor.load_images(urls) if urls else []
        return self.prepare(text, images, add_special_tokens=False)

    def next_request_id(self) -> str:
        return f"req-{next(self._ids)}"

    def add_request(self, request_id: str, prompt: PreparedPrompt, params: SamplingParams,
                    delta: bool = False, final_only: bool = False) -> None:
        requests = self.input_processor.make_requests(request_id, prompt, params)
        self.output_processor.add(request_id, prompt.text, requests, delta, final_only)
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
