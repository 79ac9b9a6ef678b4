"""Golden replay over fixtures/<case>/: ingest the case's traces, run its commands, compare.

Adding a folder with a case.toml adds a case. Every run is checked twice over: against the
golden file in expected/ (regenerated only with --update-golden) and against an independent
brute-force computation from the raw JSON.
"""

from __future__ import annotations

import json
import math
import tomllib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from servewatch.cli import app
from tests.conftest import FIXTURES

CASES = sorted(p.parent for p in FIXTURES.glob("*/case.toml"))
PERCENTILES = (50, 90, 95, 99)


def case_runs() -> list[tuple[Path, dict[str, Any]]]:
    runs = []
    for case in CASES:
        spec = tomllib.loads((case / "case.toml").read_text(encoding="utf-8"))
        runs.extend((case, run) for run in spec.get("sli", []))
    return runs


def trace_files(case: Path) -> list[Path]:
    return sorted(p for p in case.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))


# -- the oracle: plain Python over the raw JSON, sharing no code with servewatch --------------


def linear_percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = p / 100 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def raw_requests(case: Path) -> list[dict[str, Any]]:
    out = []
    for path in trace_files(case):
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line)["resourceSpans"]:
                resource = {a["key"]: a["value"] for a in rs["resource"]["attributes"]}
                replica = resource["servewatch.replica"]["stringValue"]
                for ss in rs["scopeSpans"]:
                    for span in ss["spans"]:
                        if span["name"] != "llm_request":
                            continue
                        attrs = {}
                        for a in span["attributes"]:
                            value = a["value"]
                            attrs[a["key"]] = (
                                float(value["doubleValue"])
                                if "doubleValue" in value
                                else int(value["intValue"])
                                if "intValue" in value
                                else value.get("stringValue")
                            )
                        out.append(
                            {
                                "replica": replica,
                                "pool": resource["servewatch.pool"]["stringValue"],
                                # the store keeps microseconds
                                "start": int(span["startTimeUnixNano"]) // 1000 / 1e6,
                                "end": int(span["endTimeUnixNano"]) // 1000 / 1e6,
                                "ok": span.get("status", {}).get("code", 0) != 2,
                                "ttft": attrs["gen_ai.latency.time_to_first_token"],
                                "e2e": attrs["gen_ai.latency.e2e"],
                                "decode": attrs["gen_ai.latency.time_in_model_decode"],
                                "n": attrs["gen_ai.usage.completion_tokens"],
                            }
                        )
    return out


def parse_arg_time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).timestamp()


def oracle(requests: list[dict[str, Any]], args: list[str]) -> dict[str, Any]:
    opts = dict(zip(args[::2], args[1::2], strict=True))
    opts.pop("--window", None)
    opts.pop("--by", None)
    lo = parse_arg_time(opts["--from"]) if "--from" in opts else -math.inf
    hi = parse_arg_time(opts["--to"]) if "--to" in opts else math.inf
    limits = {
        k: float(opts[f"--{k}-ms"]) / 1000 for k in ("ttft", "tpot", "e2e") if f"--{k}-ms" in opts
    }
    chosen = [r for r in requests if lo <= r["end"] < hi]
    window = (
        (hi - lo)
        if math.isfinite(lo) and math.isfinite(hi)
        else (max(r["end"] for r in chosen) - min(r["start"] for r in chosen))
    )

    def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
        ok = [r for r in rows if r["ok"]]
        tpots = [r["decode"] / (r["n"] - 1) for r in ok if r["n"] > 1]
        good = None
        if limits:
            good = 0
            for r in ok:
                tpot = r["decode"] / (r["n"] - 1) if r["n"] > 1 else 0.0
                metric = {"ttft": r["ttft"], "tpot": tpot, "e2e": r["e2e"]}
                good += all(metric[k] <= v for k, v in limits.items())
        good_tokens = None
        if limits:
            good_tokens = 0
            for r in ok:
                tpot = r["decode"] / (r["n"] - 1) if r["n"] > 1 else 0.0
                metric = {"ttft": r["ttft"], "tpot": tpot, "e2e": r["e2e"]}
                good_tokens += r["n"] if all(metric[k] <= v for k, v in limits.items()) else 0
        all_tokens = sum(r["n"] for r in rows)
        result: dict[str, Any] = {
            "requests": len(rows),
            "failed_requests": len(rows) - len(ok),
            "good_requests": good,
            "goodput_rps": None if good is None else good / window,
            "attainment_ratio": None if good is None or not rows else good / len(rows),
            "output_tokens": all_tokens,
            "good_output_tokens": good_tokens,
            "token_goodput_tps": None if good_tokens is None else good_tokens / window,
            "token_goodput_ratio": None
            if good_tokens is None or not all_tokens
            else good_tokens / all_tokens,
        }
        for name, values in (
            ("ttft_s", [r["ttft"] for r in ok]),
            ("tpot_s", tpots),
            ("e2e_s", [r["e2e"] for r in ok]),
        ):
            result[name] = {f"p{p}": linear_percentile(values, p) for p in PERCENTILES}
            result[name]["samples"] = len(values)
        return result

    group = opts.get("--by-group", "replica")
    keys = sorted({r[group] for r in chosen})
    return {
        "overall": summary(chosen),
        "groups": {key: summary([r for r in chosen if r[group] == key]) for key in keys},
    }


def assert_close(got: Any, want: Any, where: str) -> None:
    # Floats to 1e-9, lists item by item: how many threads Polars divides with can move a
    # quotient by an ulp (one CPU against two), which is no change in the answer.
    if isinstance(want, dict):
        for key, value in want.items():
            assert_close(got[key], value, f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list), where
        assert len(got) == len(want), where
        for i, (item, wanted) in enumerate(zip(got, want, strict=True)):
            assert_close(item, wanted, f"{where}[{i}]")
    elif isinstance(want, float) and got is not None:
        assert got == pytest.approx(want, rel=1e-9, abs=1e-12), where
    else:
        assert got == want, where


@pytest.mark.parametrize(
    ("case", "run"), case_runs(), ids=lambda v: v.name if isinstance(v, Path) else v["golden"]
)
def test_replay(
    case: Path, run: dict[str, Any], tmp_path: Path, runner: CliRunner, update_golden: bool
) -> None:
    db = str(tmp_path / "replay.duckdb")
    files = [str(p) for p in trace_files(case)]
    for _ in range(2):  # ingest twice: the answer must not change
        ingest = runner.invoke(app, ["--db", db, "ingest", "traces", *files, "--json"])
        assert ingest.exit_code == 0, ingest.output
    result = runner.invoke(app, ["--db", db, "sli", "--json", *run["args"]])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)

    args = run["args"]
    opts = dict(zip(args[::2], args[1::2], strict=True))
    group = opts.get("--by", "replica")
    limit_args = [a for pair in opts.items() if pair[0].endswith("-ms") for a in pair]
    raw = raw_requests(case)
    want = oracle(raw, [*args, "--by-group", group])
    assert_close(got["overall"], want["overall"], "overall")
    assert got["by"] == group
    assert {r[group] for r in got["groups"]} == set(want["groups"])
    for row in got["groups"]:
        assert_close(row, want["groups"][row[group]], str(row[group]))
    if "--window" in opts:
        # Each window of the series is exactly the report one would get for that window alone.
        assert got["series"], "a --window report has a series"
        for window in got["series"]:
            alone = oracle(raw, ["--from", window["from"], "--to", window["to"], *limit_args])
            assert_close(window["overall"], alone["overall"], window["from"])

    golden = case / "expected" / run["golden"]
    if update_golden:
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    assert golden.exists(), f"{golden} missing: run pytest with --update-golden once"
    assert_close(got, json.loads(golden.read_text(encoding="utf-8")), golden.name)
