"""scripts/gpu/phone_agent_bench.py's reading of a step trace with known costs: the fit of a
step's device time to what it carried, where lines that the host bound (no wait for the device)
time the host's launch and must not bend it; the prompt steps' launch times."""
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "gpu"))

from phone_agent_bench import HOST_BOUND_WAIT_MS, prompt_launches, step_cost_fit  # noqa: E402

COST = dict(intercept_ms=5.5, prompt_token_ms=0.029, vision_token_ms=0.031, decode_row_ms=0.2)


def trace(steps: int, host_bound_every: int) -> list[dict]:
    """Each line's time is the device's for the step before it, plus a launch the device
    waited on; every host_bound_every-th launch outlasts the device (slow eager launches):
    its line is that launch's time and it waited for nothing."""
    rng = random.Random(0)
    lines = []
    device_ms = 0.0
    for i in range(steps):
        carried = dict(decode_rows=rng.randint(0, 16), prompt_tokens=rng.choice([0, 300, 700]),
                       encoder_tokens=rng.choice([0, 0, 710]))
        if i % host_bound_every == 0:
            ms, wait = device_ms + 40.0 + rng.random() * 60, 0.0
        else:
            ms, wait = device_ms, 1.0 + device_ms / 2
        lines.append(dict(carried, ms=ms, wait_ms=wait))
        device_ms = (COST["intercept_ms"] + COST["prompt_token_ms"] * carried["prompt_tokens"]
                     + COST["vision_token_ms"] * carried["encoder_tokens"]
                     + COST["decode_row_ms"] * carried["decode_rows"])
    return lines


def test_the_fit_recovers_the_device_costs_past_host_bound_lines():
    lines = trace(400, host_bound_every=5)
    assert sum(line["wait_ms"] < HOST_BOUND_WAIT_MS for line in lines) == 80
    fit = step_cost_fit(lines)
    for key, cost in COST.items():
        assert abs(fit[key] - cost) < 0.02 * cost, (key, fit[key], cost)
    assert abs(fit["vision_over_prompt"] - 31 / 29) < 0.02


def test_traces_without_waits_are_fitted_on_every_line():
    lines = [{k: v for k, v in line.items() if k != "wait_ms"}
             for line in trace(100, host_bound_every=10**6)]
    fit = step_cost_fit(lines)
    assert abs(fit["prompt_token_ms"] - COST["prompt_token_ms"]) < 1e-3 * COST["prompt_token_ms"]


def test_prompt_launches_count_the_slow_ones_among_prompt_steps_only():
    lines = [dict(prompt_tokens=300 * (i % 2), launch_cpu_ms=float(10 + i)) for i in range(100)]
    lines[3]["launch_cpu_ms"] = 150.0       # a prompt step's launch that loaded a kernel
    lines[4]["launch_cpu_ms"] = 500.0       # a decode-only step: not a prompt launch
    got = prompt_launches(lines)
    assert got["count"] == 50
    assert got["over_60ms"] == 1 + sum(10 + i > 60 for i in range(1, 100, 2))   # 150 and 71..109
    assert got["cpu_max_ms"] == 150.0 and got["cpu_p50_ms"] == 63.0
    assert prompt_launches([dict(prompt_tokens=0, launch_cpu_ms=1.0)]) == {}
