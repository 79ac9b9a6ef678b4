"""The engine model against real engines: fit from a measured sweep's low loads, predict its knee.

An accuracy check, not a speed benchmark (so `python -m bench` does not run it):
`python -m bench.real_sweeps [FOLDER]`, FOLDER holding the published load sweeps (default
`../shared/real-sweeps` beside the checkout). The sweeps are summaries, one row of percentiles
per offered rate, not spans, so each level stands in for its requests at its medians: requests
of the sweep's lengths (fixed, or drawn as its client drew them), each with the median TTFT and
the median TPOT (or ITL) over its decode steps. What the decode steps carried follows from
Little's law, as the span fit reconstructs it per request (capacity/engine_fit.py): at `qps`
arrivals a second, each step of length TPOT carries `qps x TPOT x decode steps per request`
decoding sequences and `qps x TPOT` prefills of the mean prompt. Those rows go through the
product's own fit and knee search (`fit_engine`, `search_knee`) for one replica, with the
engine's limits at the emulator's defaults, and the predicted knee is set against the measured
one: the last offered rate that met the SLO and the first that did not.

Fitted only from levels below the knee (`fit_rates`); medians hide the spread a span fit sees,
so this checks the step model and the search, not the bootstrap's interval.
"""

from __future__ import annotations

import csv
import json
import random
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import polars as pl

from servewatch.capacity.engine_fit import fit_engine
from servewatch.capacity.knee_search import KneeSearchSpec, search_knee
from servewatch.emulator.fleet_config import RouterPolicy

DEFAULT_FOLDER = Path(__file__).resolve().parents[2] / "shared" / "real-sweeps"
REQUESTS_PER_LEVEL = 60
T0 = datetime(2026, 1, 1)


@dataclass(frozen=True)
class Level:
    qps: float
    ttft_p50_s: float
    tpot_p50_s: float


@dataclass(frozen=True)
class Sweep:
    name: str
    levels: tuple[Level, ...]
    fit_rates: tuple[float, ...]
    prompt_tokens: int
    completion_tokens: int
    ttft_limit_s: float
    tpot_limit_s: float
    target_ratio: float
    slo: str
    measured_met_rps: float  # the highest offered rate that met the SLO
    measured_missed_rps: float  # the lowest that did not
    # Lengths drawn uniformly from 1 to twice the mean (sglang.bench_serving's random dataset
    # with range ratio 0), not fixed.
    uniform_lengths: bool = False


def pegainfer_vllm(folder: Path) -> Sweep:
    """vLLM 0.22.1, Qwen3-4B on one RTX 5090, run A: input 1024, output 128 fixed."""
    with (folder / "pegainfer_qwen3_4b_rtx5090" / "qps_sweeps.csv").open() as handle:
        rows = [
            r for r in csv.DictReader(handle) if r["run"].startswith("A_") and r["engine"] == "vllm"
        ]
    levels = tuple(
        Level(float(r["qps_offered"]), float(r["ttft_p50_ms"]) / 1e3, float(r["tpot_p50_ms"]) / 1e3)
        for r in rows
    )
    # Measured: TTFT p99 0.41 s and TPOT p99 49 ms at 12 req/s; 10.7 s and 80 ms at 16.
    return Sweep(
        name="vLLM 0.22.1, Qwen3-4B, 1x RTX 5090",
        levels=levels,
        fit_rates=(1.0, 2.0, 4.0, 8.0),
        prompt_tokens=1024,
        completion_tokens=128,
        ttft_limit_s=1.0,
        tpot_limit_s=0.05,
        target_ratio=0.99,
        slo="p99 TTFT <= 1 s and p99 TPOT <= 50 ms",
        measured_met_rps=12.0,
        measured_missed_rps=16.0,
    )


def sglang_llama70b(folder: Path) -> Sweep:
    """SGLang, Llama-3.3-70B on 4x H200 (TP4): lengths uniform up to 1024, medians only."""
    path = folder / "datacrunch_sglang_llama70b_h200" / "llama_3_3_70b_online_output.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["dataset_name"] == "random"]
    levels = tuple(
        Level(r["request_rate"], r["median_ttft_ms"] / 1e3, r["median_itl_ms"] / 1e3) for r in rows
    )
    prompt = round(sum(r["total_input_tokens"] / r["completed"] for r in rows) / len(rows))
    completion = round(sum(r["total_output_tokens"] / r["completed"] for r in rows) / len(rows))
    # Measured: median ITL 19.4 ms at 4 req/s, 70.8 ms at 8.
    return Sweep(
        name="SGLang, Llama-3.3-70B, 4x H200 TP4",
        levels=levels,
        fit_rates=(1.0, 2.0, 4.0),
        prompt_tokens=prompt,
        completion_tokens=completion,
        ttft_limit_s=1.0,
        tpot_limit_s=0.05,
        target_ratio=0.5,
        slo="median TTFT <= 1 s and median TPOT <= 50 ms",
        measured_met_rps=4.0,
        measured_missed_rps=8.0,
        uniform_lengths=True,
    )


def level_frames(sweep: Sweep) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The fit levels as decode-step rows (engine_fit.decode_steps' shape) and as requests."""
    steps = sweep.completion_tokens - 1
    rng = random.Random(1)
    step_rows, request_rows = [], []
    for i, level in enumerate(lv for lv in sweep.levels if lv.qps in sweep.fit_rates):
        minute = T0 + timedelta(minutes=i)
        per_step = level.qps * level.tpot_p50_s
        for j in range(REQUESTS_PER_LEVEL):
            prompt, completion = sweep.prompt_tokens, sweep.completion_tokens
            if sweep.uniform_lengths:
                prompt = rng.randint(1, 2 * prompt - 1)
                completion = rng.randint(2, 2 * completion - 2)
            step_rows.append(
                {
                    "replica": "replica-0",
                    "minute_ts": minute,
                    "steps": float(steps),
                    "tpot_s": level.tpot_p50_s,
                    "seqs_per_step": per_step * (steps + 1),
                    "prefill_tokens_per_step": per_step * sweep.prompt_tokens,
                }
            )
            request_rows.append(
                {
                    "request_id": f"{i}-{j}",
                    "replica": "replica-0",
                    "arrival_ts": minute,
                    "ok": True,
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "ttft_s": level.ttft_p50_s,
                    "e2e_s": level.ttft_p50_s + (completion - 1) * level.tpot_p50_s,
                    "decode_s": (completion - 1) * level.tpot_p50_s,
                }
            )
    return pl.DataFrame(step_rows), pl.DataFrame(request_rows)


def check(sweep: Sweep) -> dict[str, object]:
    steps, requests = level_frames(sweep)
    fit = fit_engine(steps, seed=1, resamples=24, source=sweep.name)
    fit_levels = [lv for lv in sweep.levels if lv.qps in sweep.fit_rates]
    model = search_knee(
        fit,
        requests,
        load_rps=sum(lv.qps for lv in fit_levels) / len(fit_levels),
        observed_attainment_ratio=1.0,
        spec=KneeSearchSpec(
            ttft_limit_s=sweep.ttft_limit_s,
            tpot_limit_s=sweep.tpot_limit_s,
            target_ratio=sweep.target_ratio,
            replicas=1,
            router=RouterPolicy.ROUND_ROBIN,
            seed=1,
        ),
    )
    knee = model.knee_rps
    if knee < sweep.measured_met_rps:
        verdict = f"{knee / sweep.measured_met_rps - 1:+.0%} below the last rate that met it"
    elif knee > sweep.measured_missed_rps:
        verdict = f"{knee / sweep.measured_missed_rps - 1:+.0%} above the first that missed it"
    else:
        verdict = "within the measured bracket"
    return {
        "sweep": sweep.name,
        "slo": sweep.slo,
        "fitted_from_rps": list(sweep.fit_rates),
        "step": fit.step.summary(),
        "predicted_knee_rps": round(knee, 2),
        "interval_rps": [round(model.low_rps, 2), round(model.high_rps, 2)],
        "measured_bracket_rps": [sweep.measured_met_rps, sweep.measured_missed_rps],
        "verdict": verdict,
    }


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_FOLDER
    if not folder.is_dir():
        sys.exit(f"python -m bench.real_sweeps: no sweep folder at {folder}; pass its path")
    for load in (pegainfer_vllm, sglang_llama70b):
        print(json.dumps(check(load(folder)), indent=2), flush=True)


if __name__ == "__main__":
    main()
