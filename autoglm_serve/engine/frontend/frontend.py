"""What runs before and after the engine core, and needs no model weights: the tokenizer and
chat template, image loading and preprocessing, prompt validation (input processor), and
detokenization with stop strings (output processor).

Built from the config and the checkpoint's config files alone, so the server's front-end can
have it while the core loads the model in its own process.
"""
from __future__ import annotations

import itertools

from autoglm_serve.engine.frontend.chat_template import (PromptError, RenderedPrompt, content_format_for,
                                                render_chat)
from autoglm_serve.engine.frontend.input_processor import InputProcessor, PreparedPrompt
from autoglm_serve.engine.core.model_setup import (generation_config, generation_defaults, is_builtin,
                                              text_config)
from autoglm_serve.engine.frontend.output_processor import OutputProcessor
from autoglm_serve.engine.settings import EngineSettings
from autoglm_serve.models.configs.glm_tokenizer import TAG_OFFSETS
from autoglm_serve.loader.model_path import processor_defaults
from autoglm_serve.models.registry import resolve_model_class
from autoglm_serve.tokenizer import load_tokenizer


def eos_ids(tokenizer, hf_config, gen_config: dict) -> set[int]:
    ids: set[int] = set()
    for eos in (getattr(text_config(hf_config), "eos_token_id", None),
                getattr(hf_config, "eos_token_id", None), gen_config.get("eos_token_id")):
        ids.update([eos] if isinstance(eos, int) else (eos or []))
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def load_engine_tokenizer(settings: EngineSettings):
    """The tokenizer of the served model (the core loads it too, for grammars)."""
    config = settings.config
    if config.tokenizer is None and is_builtin(settings.model.path):
        # the packaged architecture has no tokenizer files: GLM's special tokens and chat
        # template over byte-level text (models/configs/glm_tokenizer.py)
        from autoglm_serve.models.configs.glm_tokenizer import byte_level_glm_tokenizer
        return byte_level_glm_tokenizer()
    return load_tokenizer(settings.model.path, config.tokenizer, config.download_dir)


class Frontend:
    def __init__(self, settings: EngineSettings):
        config = self.config = settings.config
        self.resolved = settings.model
        self.hf_config = settings.hf_config
        self.max_model_len = settings.max_model_len
        self.vocab_size = settings.vocab_size
        gen_config = generation_config(self.resolved)     # read once: defaults and EOS ids
        self.generation_defaults = generation_defaults(gen_config)
        if config.model is None:   # the embedded default: see DEFAULT_MAX_NEW_TOKENS
            from autoglm_serve.loader.default_model import DEFAULT_MAX_NEW_TOKENS
            self.generation_defaults.setdefault("max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
        self.tokenizer = None if config.skip_tokenizer_init else load_engine_tokenizer(settings)
        if config.chat_template and self.tokenizer is not None:
            self.tokenizer.chat_template = config.chat_template
        self.input_processor = InputProcessor(
            self.tokenizer, self.max_model_len, self.vocab_size,
            eos_ids(self.tokenizer, self.hf_config, gen_config))
        self.output_processor = OutputProcessor(self.tokenizer, keep_special_tokens=TAG_OFFSETS)
        self.mm_processor = None
        if hasattr(resolve_model_class(self.hf_config), "embed_images"):
            from autoglm_serve.multimodal.media import MediaPolicy
            from autoglm_serve.multimodal.processor import MultiModalProcessor
            path = self.resolved.path
            self.mm_processor = MultiModalProcessor(
                self.hf_config, path if path.is_dir() else None,
                {**processor_defaults(self.resolved), **config.mm_processor_kwargs},
                config.limit_mm_per_prompt,
                MediaPolicy(local_media_dir=config.allowed_local_media_path,
                            allowed_domains=tuple(config.allowed_media_domains)))
        self.content_format = content_format_for(
            config.chat_template_content_format, self.tokenizer,
            self.mm_processor.placeholder_ids if self.mm_processor is not None else None)
        self._ids = itertools.count()

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

    def render_chat(self, messages: list[dict], **options) -> RenderedPrompt:
        """OpenAI-style messages through the chat template in this model's content format;
        options: chat_template, template_kwargs, add_generation_prompt, continue_final_message,
        tools. Raises PromptError."""
        if self.tokenizer is None:
            raise PromptError("this model has no tokenizer: give prompts as token ids")
        rendered = render_chat(self.tokenizer, messages, self.content_format, **options)
        if rendered.images and self.mm_processor is None:
            raise PromptError(f"model {self.model_name} does not accept image input (it has "
                              "no vision encoder)")
        return rendered

    def prepare_rendered(self, rendered: RenderedPrompt) -> PreparedPrompt:
        """Tokenized, its images loaded under the media policy and their placeholders expanded:
        seconds for a large image, so the server runs it on a worker thread."""
        images = self.mm_processor.load_images([ref.url for ref in rendered.images]) \
            if rendered.images else []
        return self.prepare(rendered.prompt, images, add_special_tokens=False)

    def prepare_chat(self, messages: list[dict], **options) -> PreparedPrompt:
        return self.prepare_rendered(self.render_chat(messages, **options))

    def next_request_id(self) -> str:
        return f"req-{next(self._ids)}"
