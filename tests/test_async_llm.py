"""AsyncLLM, the server's engine, without HTTP: outputs that pile up behind a slow consumer
reach it merged and add up to the whole answer, with the core in its own process or on a
thread; a bad request fails alone; a shut-down engine leaves no process behind."""
import asyncio

import pytest

from autoglm_serve.config import EngineConfig
from autoglm_serve.engine.async_llm import AsyncLLM
from autoglm_serve.sampling_params import SamplingParams
from tests.tiny_llama import build_tiny_llama

PROMPT = "open the settings app and turn on wifi"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.mark.parametrize("core_process", [True, False], ids=["process", "thread"])
def test_a_slow_consumer_gets_merged_outputs_that_add_up(tiny, core_process):
    config = EngineConfig(model=str(tiny), dtype="float32", max_model_len=512,
                          kv_cache_memory_gib=0.05)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)

    async def run():
        engine = AsyncLLM(config, core_process=core_process)
        engine.start()
        try:
            whole = [o async for o in engine.generate("whole", PROMPT, params, delta=False)]
            pieces = []
            async for out in engine.generate("slow", PROMPT, params):
                pieces.append(out)
                await asyncio.sleep(0.2)       # many engine steps: their tokens pile up
            with pytest.raises(ValueError, match="prompt is empty"):
                await engine.generate("bad", [], params).__anext__()
            again = [o async for o in engine.generate("again", PROMPT, params, delta=False)]
            return engine, whole[-1], pieces, again[-1]
        finally:
            engine.shutdown()

    engine, whole, pieces, again = asyncio.run(run())
    full = whole.outputs[0]
    assert whole.finished and full.finish_reason == "length" and len(full.token_ids) == 24
    sizes = [len(p.outputs[0].token_ids) for p in pieces if p.outputs]
    assert max(sizes) > 1 and sum(sizes) == 24, sizes
    joined = [c for p in pieces for c in p.outputs]
    assert "".join(c.text for c in joined) == full.text
    assert [t for c in joined for t in c.token_ids] == full.token_ids
    assert [e for c in joined for e in c.logprobs] == full.logprobs
    assert pieces[-1].finished and joined[-1].finish_reason == "length"
    assert [p.finished for p in pieces].count(True) == 1
    assert again.outputs[0].token_ids == full.token_ids      # the bad request changed nothing
    assert engine.num_unfinished == 0 and engine.stats.num_running == 0
    if core_process:
        assert engine.info.core_pid == engine.client.process.pid
        assert not engine.client.process.is_alive() and engine.client.process.exitcode == 0
