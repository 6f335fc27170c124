"""What one benchmark request leaves behind: its timestamps, token counts and outcome.

Every producer (the HTTP client, the offline engine driver, the phone-agent loop) fills this and
every consumer (metrics, reports, plots) reads only this, so engines are compared on the same data.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """Raw measurements of one request. Times are time.perf_counter() seconds (monotonic)."""

    index: int  # position in the dataset
    prompt_len: int  # prompt tokens: server usage when given, else the dataset's count
    expected_output_len: int  # max tokens asked for
    start: float = 0.0  # request sent
    end: float = 0.0  # response complete (or failed)
    # Arrival of every streamed chunk that carried generated text (content, reasoning or text).
    chunk_times: list[float] = field(default_factory=list)
    output_tokens: int | None = None  # from the usage chunk; None when the server sent none
    output_tokens_source: str = "usage"  # usage | tokenizer | chunks
    generated_text: str = ""
    success: bool = False
    error: str = ""
    # Phone-agent workload only: which simulated agent and which step of its episode.
    agent: int | None = None
    step: int | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token: request sent -> first chunk with generated text."""
        if not self.success or not self.chunk_times:
            return None
        return self.chunk_times[0] - self.start

    @property
    def e2el(self) -> float | None:
        """End-to-end latency: request sent -> full response received."""
        return self.end - self.start if self.success else None

    @property
    def itl(self) -> list[float]:
        """Inter-token latencies: every gap between successive streamed chunks."""
        if not self.success:
            return []
        t = self.chunk_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2el - ttft) / (output_tokens - 1).

        None when fewer than two tokens came back: there is no decode phase to measure.
        """
        n = self.output_tokens
        ttft, e2el = self.ttft, self.e2el
        if ttft is None or e2el is None or n is None or n < 2:
            return None
        return (e2el - ttft) / (n - 1)
