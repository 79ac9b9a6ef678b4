"""The replica engine's parameters: step-time model, batching limits, KV cache, cold start.

Its own module, interpreted even when the engine runs compiled (emulator/native.py): the
parameters are a plain frozen dataclass that configuration code introspects (`vars`), which a
compiled class would not allow, and the engine reads them only once, when it is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servewatch.emulator.workload import SpecError


@dataclass(frozen=True)
class EngineParams:
    """One replica's engine: step-time model, batching limits, KV cache. Loosely an 8B model
    on one H100 (bf16 weights, about 55 GB left for KV at 128 KiB per token)."""

    step_base_s: float = 0.006
    step_per_seq_s: float = 0.00006
    step_per_prefill_token_s: float = 0.00004
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    block_size_tokens: int = 16
    num_gpu_blocks: int = 28_000
    max_model_len: int = 16_384
    enable_prefix_caching: bool = True
    cold_start_s: float = 90.0

    def __post_init__(self) -> None:
        for name in ("step_base_s", "step_per_seq_s", "step_per_prefill_token_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise SpecError(name, f"must be a finite number >= 0, got {value}")
        if self.step_base_s + self.step_per_seq_s <= 0:
            raise SpecError("step_base_s", "a decode step must take time: step_base_s > 0")
        for name in ("max_num_seqs", "block_size_tokens", "num_gpu_blocks", "max_model_len"):
            if getattr(self, name) < 1:
                raise SpecError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise SpecError(
                "max_num_batched_tokens",
                f"must be >= max_num_seqs ({self.max_num_seqs}), got {self.max_num_batched_tokens}",
            )
        if -(-self.max_model_len // self.block_size_tokens) > self.num_gpu_blocks:
            raise SpecError(
                "max_model_len",
                f"a request of max_model_len tokens needs "
                f"{-(-self.max_model_len // self.block_size_tokens)} blocks, more than "
                f"num_gpu_blocks ({self.num_gpu_blocks})",
            )
        if not self.cold_start_s >= 0:
            raise SpecError("cold_start_s", f"must be >= 0, got {self.cold_start_s}")
