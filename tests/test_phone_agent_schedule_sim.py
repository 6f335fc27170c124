"""The phone-agent load through the real Scheduler on a simulated clock
(scripts/phone_agent_schedule_sim.py): every turn is served, and no turn waits behind later
ones for the vision encoder. 64 agents' 320 turns run in ~69 simulated seconds; the last of
the 64 first turns, which arrive together, gets its first token after ~13 s. When the encoder
took running prefills' images first, the later turns that were admitted up to their
screenshot kept passing first turns held whole (and dropped their half-encoded screenshots):
their TTFT p99 reached 34-53 s."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from phone_agent_schedule_sim import simulate  # noqa: E402


@pytest.mark.parametrize("tokenizer", ["byte", "glm"])
def test_no_turn_starves_behind_later_turns(tokenizer):
    result = simulate(64, 5, tokenizer)
    assert result["turns"] == 320
    assert result["images_restarted"] == 0
    # a turn's wait is at most the cold start's queue of first turns (64 screenshots and
    # prompts, ~13 s), far below the run's length
    assert result["ttft_max_s"] < 0.25 * result["simulated_s"], result


def test_decode_step_budget_bounds_what_decoding_requests_wait_for():
    """With a budget while requests decode, no gap between a request's tokens is longer than a
    step of that budget (16 decode rows, at most one vision block and the merger past it);
    without it, gaps last whole 2,048-token steps."""
    from phone_agent_schedule_sim import BLOCK_COST, MERGER_COST, step_ms
    capped = simulate(16, 2, "glm", decode_step_tokens=512)
    whole = simulate(16, 2, "glm")
    assert capped["turns"] == whole["turns"] == 32
    assert capped["itl_max_ms"] <= step_ms(16, 512, BLOCK_COST + MERGER_COST), capped
    assert whole["itl_max_ms"] > step_ms(16, 1024, 0), whole
