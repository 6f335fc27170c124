"""Outputs that pile up behind a slow consumer reach it merged, equal to the sum of their parts."""
import asyncio

from autoglm_serve.engine.frontend.output_collector import RequestOutputCollector
from autoglm_serve.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput

METRICS = RequestMetrics(arrival_time=0.0)


def delta(*completions, finished=False, cached=0) -> RequestOutput:
    return RequestOutput("r", None, [1, 2], list(completions), finished, METRICS, cached)


def part(index, text, ids, finish=None, logprobs=None, cumulative=None) -> CompletionOutput:
    return CompletionOutput(index, text, list(ids), finish, None, logprobs, cumulative)


def lp(value) -> dict[int, Logprob]:
    return {7: Logprob(value, 1, "x")}


def test_deltas_merge_per_choice_in_arrival_order():
    async def run():
        c = RequestOutputCollector(delta=True)
        c.put(delta(part(0, "Hel", [1], logprobs=[lp(-1.0)], cumulative=-1.0)))
        c.put(delta(part(1, "A", [9])))
        c.put(delta(part(0, "lo", [2], logprobs=[lp(-2.0)], cumulative=-3.0), cached=16))
        c.put(delta(part(0, "!", [3], "length", [lp(-0.5)], -3.5), part(1, "B", [8], "stop"),
                    finished=True, cached=16))
        return await c.get()

    out = asyncio.run(run())
    assert out.finished and out.num_cached_tokens == 16
    first, second = out.outputs
    assert (first.index, first.text, first.token_ids, first.finish_reason) == \
        (0, "Hello!", [1, 2, 3], "length")
    assert [e[7].logprob for e in first.logprobs] == [-1.0, -2.0, -0.5]
    assert first.cumulative_logprob == -3.5
    assert (second.index, second.text, second.token_ids, second.finish_reason) == \
        (1, "AB", [9, 8], "stop")


def test_a_waiting_consumer_gets_each_output_alone():
    async def run():
        c = RequestOutputCollector(delta=True)
        got = []

        async def consume():
            for _ in range(2):
                got.append(await c.get())

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0)
        c.put(delta(part(0, "a", [1])))
        await asyncio.sleep(0)
        c.put(delta(part(0, "b", [2]), finished=True))
        await task
        return got

    got = asyncio.run(run())
    assert [o.outputs[0].text for o in got] == ["a", "b"]


def test_cumulative_outputs_keep_the_latest_and_an_error_wins():
    async def run():
        c = RequestOutputCollector(delta=False)
        c.put(delta(part(0, "He", [1, 2])))
        c.put(delta(part(0, "Hello", [1, 2, 3])))
        latest = await c.get()
        c.put(RuntimeError("core died"))
        c.put(delta(part(0, "Hello!", [1, 2, 3, 4])))
        return latest, await c.get()

    latest, error = asyncio.run(run())
    assert latest.outputs[0].text == "Hello" and latest.outputs[0].token_ids == [1, 2, 3]
    assert isinstance(error, RuntimeError)
