"""The emulated gateway's page: what the endpoint picker (EPP) of a Gateway API inference
gateway, as llm-d runs it, reports about the requests it routed and refused for its pool.

The fleet tells a `GatewayObserver` of every request that reaches the gateway and what became
of it (`gateway_request`), only when it has an admission limit (config.admission): a fleet
without one has no gateway target, and its outputs are what they were before the gateway was
emulated. The page keeps the EPP's counting (pkg/epp/handlers/server.go, metrics.go):

- `inference_objective_request_total{model_name,target_model_name}` counts the requests the
  picker handed to a replica; a request it refuses is never counted there;
- `inference_objective_request_error_total{error_code,model_name,target_model_name}` counts
  errors: a request shed by the admission limit as `InferencePoolResourceExhausted`, one that
  found no replica up or free as `ServiceUnavailable` (both refused before any replica saw
  them), and a prompt the replica turns away as too long as `ModelServerError` (dispatched,
  so it is in the request counter too);
- `inference_pool_average_kv_cache_utilization`, `inference_pool_average_queue_size` and
  `inference_pool_ready_pods` (`{name}`: the pool) are the means over the replicas up at the
  latest snapshot, and how many are up.

The page is client_golang's text format 0.0.4: families sorted by name, labels sorted, an error
family absent until its first error, numbers as Go's `strconv.AppendFloat(v, 'g', -1, 64)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Protocol, runtime_checkable

from servewatch.emulator.fleet_config import FleetConfig
from servewatch.emulator.records import ReplicaState

PAGE_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
EMULATED_GAUGE = "servewatch_emulated"

_SHORTEST_EXPONENT_AT = 6  # strconv's 'g' with the shortest precision decides at 6 digits
# Error codes as pkg/epp/util/error names them.
SHED = "InferencePoolResourceExhausted"
NO_ENDPOINT = "ServiceUnavailable"
MODEL_SERVER_ERROR = "ModelServerError"
# Errors raised after the request was handed to a replica (and counted as a request).
_DISPATCHED_ERRORS = frozenset((MODEL_SERVER_ERROR,))

_REQUESTS = "inference_objective_request_total"
_ERRORS = "inference_objective_request_error_total"
_HELP = {
    _REQUESTS: "Counter of inference objective requests broken out for each model and target "
    "model.",
    _ERRORS: "Counter of inference objective requests errors broken out for each model and "
    "target model.",
    "inference_pool_average_kv_cache_utilization": "The average kv cache utilization for an "
    "inference server pool.",
    "inference_pool_average_queue_size": "The average number of requests pending in the model "
    "server queue.",
    "inference_pool_ready_pods": "The number of ready pods in the inference server pool.",
}


@dataclass(frozen=True)
class GatewaySpec:
    """The gateway in front of a fleet: its target's name, the pool it serves (None when it
    fronts several: the target names none) and the model its requests name."""

    name: str
    pool: str | None
    model: str

    @classmethod
    def of(cls, config: FleetConfig) -> GatewaySpec | None:
        """The gateway of a fleet with an admission limit; None without one."""
        if config.admission is None:
            return None
        pools = {p.pool for p in config.placements()}
        pool = next(iter(pools)) if len(pools) == 1 else None
        return cls(name=pool or config.pool, pool=pool, model=config.model)


@runtime_checkable
class GatewayObserver(Protocol):
    def gateway_request(self, model: str, error_code: str | None) -> None:
        """A request reached the gateway; `error_code` is what it answered (None: routed)."""
        ...


def go_float(value: float) -> str:
    """`value` as client_golang's text encoder writes it: strconv.AppendFloat(v, 'g', -1, 64),
    the shortest digits that read back exactly, in exponent form when the exponent is below -4
    or at least 6 (so a million requests read `1e+06`)."""
    if math.isnan(value):
        return "NaN"
    if value in (math.inf, -math.inf):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "0"
    sign, digit_tuple, exponent = Decimal(repr(float(value))).normalize().as_tuple()
    if not isinstance(exponent, int):
        raise TypeError(f"not a finite number: {value!r}")
    digits = "".join(str(d) for d in digit_tuple)
    point = len(digits) + exponent  # where the decimal point falls among the digits
    exp = point - 1
    if exp < -4 or exp >= _SHORTEST_EXPONENT_AT:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        out = f"{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    elif point <= 0:
        out = "0." + "0" * -point + digits
    elif point >= len(digits):
        out = digits + "0" * (point - len(digits))
    else:
        out = digits[:point] + "." + digits[point:]
    return ("-" if sign else "") + out


class GatewayMetrics:
    """The EPP counters and pool gauges of one emulated gateway; a `GatewayObserver`."""

    def __init__(self, spec: GatewaySpec) -> None:
        self.spec = spec
        self._requests: dict[str, int] = {}  # by model name
        self._errors: dict[tuple[str, str], int] = {}  # by (error code, model name)
        self._kv_mean = 0.0
        self._waiting_mean = 0.0
        self._ready = 0

    def gateway_request(self, model: str, error_code: str | None) -> None:
        if error_code is None or error_code in _DISPATCHED_ERRORS:
            self._requests[model] = self._requests.get(model, 0) + 1
        if error_code is not None:
            key = (error_code, model)
            self._errors[key] = self._errors.get(key, 0) + 1

    @property
    def routed_requests(self) -> int:
        return sum(self._requests.values())

    def refused_requests(self, error_code: str) -> int:
        return sum(n for (code, _), n in self._errors.items() if code == error_code)

    def set_states(self, states: Iterable[ReplicaState]) -> None:
        up = [s for s in states if s.up]
        self._ready = len(up)
        self._kv_mean = sum(s.kv_usage_ratio for s in up) / len(up) if up else 0.0
        self._waiting_mean = sum(s.waiting for s in up) / len(up) if up else 0.0

    def page(self) -> bytes:
        lines: list[str] = []

        def family(name: str, kind: str, samples: list[tuple[str, float]]) -> None:
            if not samples:
                return
            lines.extend((f"# HELP {name} [ALPHA] {_HELP[name]}", f"# TYPE {name} {kind}"))
            lines.extend(f"{name}{labels} {go_float(value)}" for labels, value in samples)

        family(
            _ERRORS,
            "counter",
            [
                (
                    f'{{error_code="{code}",model_name="{model}",target_model_name="{model}"}}',
                    float(n),
                )
                for (code, model), n in sorted(self._errors.items())
            ],
        )
        family(
            _REQUESTS,
            "counter",
            [
                (f'{{model_name="{model}",target_model_name="{model}"}}', float(n))
                for model, n in sorted(self._requests.items())
            ],
        )
        pool = f'{{name="{self.spec.pool or self.spec.name}"}}'
        family("inference_pool_average_kv_cache_utilization", "gauge", [(pool, self._kv_mean)])
        family("inference_pool_average_queue_size", "gauge", [(pool, self._waiting_mean)])
        family("inference_pool_ready_pods", "gauge", [(pool, float(self._ready))])
        lines += (
            (
                f"# HELP {EMULATED_GAUGE} 1: this page comes from the servewatch emulator, "
                "not from a real inference gateway."
            ),
            f"# TYPE {EMULATED_GAUGE} gauge",
            f"{EMULATED_GAUGE} 1",
        )
        return ("\n".join(lines) + "\n").encode()
