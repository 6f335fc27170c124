"""The synchronous engine: the front-end's input processing, the core, output processing, in
one loop and one process.

The offline ``LLM`` drives it directly; the server runs the core on its own process (or thread)
instead (engine/async_llm.py) with the same front-end.
"""
from __future__ import annotations

from autoglm_serve.engine.core.engine_core import EngineCore
from autoglm_serve.engine.frontend.frontend import Frontend
from autoglm_serve.engine.frontend.input_processor import PreparedPrompt
from autoglm_serve.engine.core.model_setup import LoadedModel
from autoglm_serve.engine.settings import EngineSettings
from autoglm_serve.outputs import RequestOutput
from autoglm_serve.sampling_params import SamplingParams


class LLMEngine:
    def __init__(self, settings: EngineSettings, loaded: LoadedModel | None = None):
        self.core = EngineCore(settings, loaded)
        self.frontend = Frontend(settings)

    def add_request(self, request_id: str, prompt: PreparedPrompt, params: SamplingParams,
                    delta: bool = False, final_only: bool = False) -> None:
        requests = self.frontend.input_processor.make_requests(request_id, prompt, params)
        self.frontend.output_processor.add(request_id, prompt.text, requests, delta, final_only)
        for r in requests:
            self.core.add_request(r)

    def abort(self, request_id: str) -> None:
        self.core.abort(self.frontend.output_processor.abort(request_id))

    def shutdown(self) -> None:
        self.core.shutdown()

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def step(self) -> list[RequestOutput]:
        outputs, to_abort = self.frontend.output_processor.process(self.core.step())
        if to_abort:
            self.core.abort(to_abort)
        return outputs
