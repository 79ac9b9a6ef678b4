"""llama.cpp's server `/metrics` page of an emulated replica (the `llamacpp:` families).

The server (tools/server, with `--metrics`) prints its page by hand: HELP, TYPE and one
sample per family, no labels, no model name, no blank lines, and values through a C++ stream
(`%g`, six significant digits, so counters past a million lose precision: `2.43188e+06`).
`n_tokens_max` and `n_busy_slots_per_decode` are typed counters though they hold a maximum and
an average, as upstream types them.

There are no latency histograms: only totals of prompt and generation tokens and the seconds
spent on each, the slots processing and the deferred requests. Prompt tokens exclude those
reused from the cache, as llama.cpp counts them. The two throughput gauges are averages over
the process's life here; llama.cpp's cover the time since the previous scrape, which would make
reading a page change the next one.
"""

from __future__ import annotations

from servewatch.emulator.records import EngineSteps, FinishedRequest, ReplicaState
from servewatch.emulator.vllm_metrics import EMULATED_GAUGE, EngineSettings

PAGE_CONTENT_TYPE = "text/plain; version=0.0.4"


def c_float(value: float) -> str:
    """A double as `std::stringstream << value` writes it (printf `%g`)."""
    return f"{value:g}"


class LlamacppReplicaMetrics:
    """The metric state of one llama-server process (counters from zero at each start)."""

    def __init__(
        self, *, model_name: str, created_s: float, settings: EngineSettings, gpus: int = 1
    ) -> None:
        self.model_name = model_name
        self.created_s = created_s
        self.settings = settings
        self.gpus = gpus
        self.prompt_tokens = 0  # computed, not reused from the cache
        self.prompt_s = 0.0
        self.predicted_tokens = 0
        self.predicted_s = 0.0
        self.decode_calls = 0
        self.busy_slot_calls = 0  # decode calls weighted by the slots busy in them
        self.tokens_max = 0

    def observe_request(self, record: FinishedRequest) -> None:
        self.prompt_tokens += record.prompt_tokens - record.cached_prompt_tokens
        self.prompt_s += record.prefill_s
        self.predicted_tokens += record.completion_tokens
        self.predicted_s += record.decode_s

    def observe_steps(self, record: EngineSteps) -> None:
        if record.iterations <= 0:
            return
        self.decode_calls += record.iterations
        self.busy_slot_calls += max(record.decode_seqs, 1) * record.iterations
        self.tokens_max = max(self.tokens_max, record.decode_seqs + record.prefill_tokens)

    def page(self, state: ReplicaState | None) -> bytes:
        busy = self.busy_slot_calls / self.decode_calls if self.decode_calls else 0.0
        rows = (
            ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", self.prompt_tokens),  # noqa: E501
            ("prompt_seconds_total", "counter", "Prompt process time", self.prompt_s),
            ("tokens_predicted_total", "counter", "Number of generation tokens processed.", self.predicted_tokens),  # noqa: E501
            ("tokens_predicted_seconds_total", "counter", "Predict process time", self.predicted_s),
            ("n_decode_total", "counter", "Total number of llama_decode() calls", self.decode_calls),  # noqa: E501
            ("n_tokens_max", "counter", "Largest observed n_tokens.", self.tokens_max),
            ("n_busy_slots_per_decode", "counter", "Average number of busy slots per llama_decode() call", busy),  # noqa: E501
            (
                "prompt_tokens_seconds",
                "gauge",
                "Average prompt throughput in tokens/s.",
                self.prompt_tokens / self.prompt_s if self.prompt_s else 0.0,
            ),
            (
                "predicted_tokens_seconds",
                "gauge",
                "Average generation throughput in tokens/s.",
                self.predicted_tokens / self.predicted_s if self.predicted_s else 0.0,
            ),
            ("requests_processing", "gauge", "Number of requests processing.", state.running if state else 0),  # noqa: E501
            ("requests_deferred", "gauge", "Number of requests deferred.", state.waiting if state else 0),  # noqa: E501
        )  # fmt: skip
        lines: list[str] = []
        for name, kind, help_text, value in rows:
            lines += (
                f"# HELP llamacpp:{name} {help_text}",
                f"# TYPE llamacpp:{name} {kind}",
                f"llamacpp:{name} {c_float(value)}",
            )
        lines += (
            (
                f"# HELP {EMULATED_GAUGE} 1: this page comes from the servewatch emulator, "
                "not from a real llama.cpp server."
            ),
            f"# TYPE {EMULATED_GAUGE} gauge",
            f"{EMULATED_GAUGE} 1",
        )
        return ("\n".join(lines) + "\n").encode()
