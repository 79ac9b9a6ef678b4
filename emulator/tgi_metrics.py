"""Hugging Face TGI's `/metrics` page of an emulated replica (the `tgi_` families).

Names, help texts and buckets follow TGI's router (router/src/server.rs, validation.rs,
infer/mod.rs, backends/v3): counters, gauges and histograms recorded with the Rust `metrics`
crate and rendered by metrics-exporter-prometheus 0.15, whose text differs from
prometheus-client's: counters keep their names (no `_total`), integer counter values,
floats as Rust prints them (`1`, `0.00015000000000000001`, never an exponent), HELP only for
described families, `le` after the other labels, the `+Inf` bucket before `_sum` and
`_count`, a blank line after every family, and no model label at all. Duration histograms have
the buckets 0.0001 * 1.5**k (k = 1..35), token histograms a hundred steps up to the server's
token limits; `tgi_request_skipped_tokens` has no buckets, so the exporter writes a summary.

TGI has no time-to-first-token and no KV-usage metric; the page has none either. Latency
histograms count successful requests only, as TGI records them at the end of a successful
generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from decimal import Decimal

from servewatch.emulator.records import EngineSteps, FinishedRequest, ReplicaState
from servewatch.emulator.vllm_metrics import EMULATED_GAUGE, BucketCounts, EngineSettings

PAGE_CONTENT_TYPE = "text/plain; charset=utf-8"
METHODS = ("prefill", "decode")
CONCAT_REASONS = ("backpressure", "chunking", "wait_exceeded")
SUMMARY_QUANTILES = ("0", "0.5", "0.9", "0.95", "0.99", "0.999", "1")


def duration_buckets_s() -> tuple[float, ...]:
    """TGI's `Matcher::Suffix("duration")` buckets: 0.0001 multiplied by 1.5, 35 times."""
    value = 0.0001
    out: list[float] = []
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return tuple(out)


def step_buckets(limit: int) -> tuple[float, ...]:
    """A hundred equal steps up to `limit` tokens, as TGI sizes its token histograms."""
    return tuple((limit / 100.0) * (x + 1) for x in range(100))


DURATION_BUCKETS_S = duration_buckets_s()
BATCH_SIZE_BUCKETS = tuple(float(x) for x in range(1, 1025))


def rust_float(value: float) -> str:
    """An f64 as Rust's `Display` writes it: shortest round-trip digits, never an exponent."""
    if value != value:  # noqa: PLR0124 (NaN)
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    text = repr(value)
    if "e" in text:
        text = format(Decimal(text), "f")
    return text


def _label_text(labels: Sequence[tuple[str, str]]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{value}"' for key, value in labels) + "}"


class _Page:
    """Text built family by family in the exporter's layout."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def header(self, name: str, kind: str, help_text: str | None) -> None:
        if help_text is not None:
            self.parts.append(f"# HELP {name} {help_text}\n")
        self.parts.append(f"# TYPE {name} {kind}\n")

    def sample(self, name: str, labels: Sequence[tuple[str, str]], value: str) -> None:
        self.parts.append(f"{name}{_label_text(labels)} {value}\n")

    def end(self) -> None:
        self.parts.append("\n")

    def counter(
        self,
        name: str,
        help_text: str | None,
        children: Sequence[tuple[Sequence[tuple[str, str]], int]],
    ) -> None:
        self.header(name, "counter", help_text)
        for labels, value in children:
            self.sample(name, labels, str(value))
        self.end()

    def gauge(self, name: str, help_text: str | None, value: float) -> None:
        self.header(name, "gauge", help_text)
        self.sample(name, (), rust_float(value))
        self.end()

    def histogram(
        self,
        name: str,
        help_text: str | None,
        children: Sequence[tuple[Sequence[tuple[str, str]], BucketCounts]],
    ) -> None:
        self.header(name, "histogram", help_text)
        for labels, counts in children:
            running = 0
            for bound, n in zip(counts.bounds, counts.counts, strict=False):
                running += n
                self.sample(f"{name}_bucket", (*labels, ("le", rust_float(bound))), str(running))
            running += counts.counts[-1]
            self.sample(f"{name}_bucket", (*labels, ("le", "+Inf")), str(running))
            self.sample(f"{name}_sum", labels, rust_float(counts.sum))
            self.sample(f"{name}_count", labels, str(running))
        self.end()

    def text(self) -> bytes:
        return "".join(self.parts).encode()


class TgiReplicaMetrics:
    """The metric state of one TGI router and its backend (counters from zero at each start).

    TGI's token histograms are sized by its limits: `max_total_tokens` is the engine's
    max_model_len, `max_input_tokens` one less (TGI's defaults for a model of that length).
    """

    def __init__(
        self, *, model_name: str, created_s: float, settings: EngineSettings, gpus: int = 1
    ) -> None:
        self.model_name = model_name
        self.created_s = created_s
        self.settings = settings
        self.gpus = gpus
        self.requests = 0
        self.successes = 0
        self.failures = {"generation": 0, "dropped": 0}
        self.inference_calls = dict.fromkeys(METHODS, 0)
        max_total = settings.max_model_len
        self.request_duration = BucketCounts(DURATION_BUCKETS_S)
        self.validation_duration = BucketCounts(DURATION_BUCKETS_S)
        self.queue_duration = BucketCounts(DURATION_BUCKETS_S)
        self.inference_duration = BucketCounts(DURATION_BUCKETS_S)
        self.mean_time_per_token = BucketCounts(DURATION_BUCKETS_S)
        self.generated_tokens = BucketCounts(step_buckets(max_total))
        self.input_length = BucketCounts(step_buckets(max(max_total - 1, 1)))
        self.max_new_tokens = BucketCounts(step_buckets(max_total))
        self.next_size = BucketCounts(BATCH_SIZE_BUCKETS)
        self.forward = {method: BucketCounts(DURATION_BUCKETS_S) for method in METHODS}
        self.decode = {method: BucketCounts(DURATION_BUCKETS_S) for method in METHODS}
        self.filter = {method: BucketCounts(DURATION_BUCKETS_S) for method in METHODS}
        self.batch_inference = {method: BucketCounts(DURATION_BUCKETS_S) for method in METHODS}
        self.concat_duration = BucketCounts(DURATION_BUCKETS_S)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.settings.num_gpu_blocks * self.settings.block_size

    def observe_request(self, record: FinishedRequest) -> None:
        """Validation records every request's input length and max_new_tokens; the latency
        and output histograms are recorded for successful requests only. The emulated
        gateway validates in no time, so validation durations are zero."""
        self.requests += 1
        self.input_length.observe(record.prompt_tokens)
        self.max_new_tokens.observe(record.max_tokens)
        reason = record.finished_reason.value
        if reason in ("error", "abort"):
            self.failures["generation" if reason == "error" else "dropped"] += 1
            return
        self.successes += 1
        inference_s = record.prefill_s + record.decode_s
        self.request_duration.observe(record.e2e_s)
        self.validation_duration.observe(0.0)
        self.queue_duration.observe(record.queue_s)
        self.inference_duration.observe(inference_s)
        if record.completion_tokens > 0:
            # TGI's mean time per token: inference time (prefill included) over tokens.
            self.mean_time_per_token.observe(inference_s / record.completion_tokens)
        self.generated_tokens.observe(record.completion_tokens)

    def observe_steps(self, record: EngineSteps) -> None:
        """A step that computes prompt tokens is a prefill call, any other a decode call."""
        if record.iterations <= 0:
            return
        method = "prefill" if record.prefill_tokens > 0 else "decode"
        self.inference_calls[method] += record.iterations
        self.forward[method].observe(record.step_s, record.iterations)
        self.batch_inference[method].observe(record.step_s, record.iterations)

    def page(self, state: ReplicaState | None) -> bytes:
        page = _Page()
        page.counter("tgi_request_count", "Total number of requests", [((), self.requests)])
        page.counter("tgi_request_success", "Number of successful requests", [((), self.successes)])
        page.counter(
            "tgi_request_failure",
            None,
            [
                ((("err", err),), count)
                for err, count in self.failures.items()
                if count or err == "generation"
            ],
        )
        calls = [((("method", m),), self.inference_calls[m]) for m in METHODS]
        page.counter(
            "tgi_batch_inference_count", "Inference calls per method (prefill or decode)", calls
        )
        page.counter(
            "tgi_batch_inference_success",
            "Number of successful inference calls per method (prefill or decode)",
            calls,
        )
        page.counter("tgi_batch_inference_failure", None, [((("method", "decode"),), 0)])
        page.counter("tgi_batch_concat", None, [((("reason", r),), 0) for r in CONCAT_REASONS])
        usage = state.kv_usage_ratio if state else 0.0
        page.gauge("tgi_queue_size", "Current queue size", float(state.waiting if state else 0))
        page.gauge(
            "tgi_batch_current_size", "Current batch size", float(state.running if state else 0)
        )
        page.gauge(
            "tgi_batch_current_max_tokens",
            "Maximum tokens for the current batch",
            float(round(usage * self.kv_capacity_tokens)),
        )
        page.gauge("tgi_batch_max_total_tokens", None, float(self.kv_capacity_tokens))
        for name, help_text, counts in (
            ("tgi_request_duration", "Request duration", self.request_duration),
            (
                "tgi_request_validation_duration",
                "Request validation duration",
                self.validation_duration,
            ),
            ("tgi_request_queue_duration", "Request queue duration", self.queue_duration),
            (
                "tgi_request_inference_duration",
                "Request inference duration",
                self.inference_duration,
            ),
            (
                "tgi_request_mean_time_per_token_duration",
                "Mean time per token per request",
                self.mean_time_per_token,
            ),
            (
                "tgi_request_generated_tokens",
                "Generated tokens per request",
                self.generated_tokens,
            ),
            ("tgi_request_input_length", "Input token length per request", self.input_length),
            (
                "tgi_request_max_new_tokens",
                "Maximum new tokens per request",
                self.max_new_tokens,
            ),
            ("tgi_batch_next_size", "Batch size of the next batch", self.next_size),
        ):
            page.histogram(name, help_text, [((), counts)])
        for name, help_text, by_method in (
            (
                "tgi_batch_forward_duration",
                "Batch forward duration per method (prefill or decode)",
                self.forward,
            ),
            (
                "tgi_batch_decode_duration",
                "Time spent decoding a batch per method (prefill or decode)",
                self.decode,
            ),
            (
                "tgi_batch_filter_duration",
                (
                    "Time spent filtering batches and sending generated tokens per method "
                    "(prefill or decode)"
                ),
                self.filter,
            ),
            (
                "tgi_batch_inference_duration",
                "Batch inference duration",
                self.batch_inference,
            ),
        ):
            page.histogram(name, help_text, [((("method", m),), by_method[m]) for m in METHODS])
        page.histogram(
            "tgi_batch_concat_duration", None, [((("method", "decode"),), self.concat_duration)]
        )
        page.header("tgi_request_skipped_tokens", "summary", "Speculated tokens per request")
        for quantile in SUMMARY_QUANTILES:
            page.sample("tgi_request_skipped_tokens", (("quantile", quantile),), "0")
        page.sample("tgi_request_skipped_tokens_sum", (), "0")
        page.sample("tgi_request_skipped_tokens_count", (), str(self.successes))
        page.end()
        page.gauge(
            EMULATED_GAUGE,
            "1: this page comes from the servewatch emulator, not from a real TGI server.",
            1.0,
        )
        return page.text()
