"""One emulated vLLM replica: a continuous-batching engine simulated event by event.

The engine model (every parameter is on `EngineParams` and in docs/emulator.md):
- Each engine step takes `step_base_s + step_per_seq_s * batch + step_per_prefill_token_s *
  prefill_tokens` seconds (times the replica's slow factor), where `batch` is the number of
  sequences in the step. A step carries one token for every decoding sequence and prompt
  chunks up to `max_num_batched_tokens` in all (chunked prefill). Running sequences are
  scheduled first, then waiting ones in arrival order while the token budget, `max_num_seqs`
  and free KV blocks allow; a waiting request that does not fit blocks the queue (FCFS).
- KV cache: `num_gpu_blocks` blocks of `block_size_tokens`. A request is admitted only when
  blocks for its whole prompt (plus the token its prefill produces) are free; decoding grows
  it a block at a time. When growth finds no free block, the most recently admitted running
  request is preempted: its blocks are freed and it rejoins the queue's front, to be prefilled
  again over prompt + generated tokens (recompute, as vLLM V1 does).
- Prefix cache: prompts are chains of segments (`workload.PrefixSegment`); the cache holds,
  per chain key, how many full blocks of that chain are resident, evicted least recently used
  first and from a chain's tail, within the KV blocks no running request holds (an eviction
  frees 1% of the KV blocks beyond what is needed, so it runs once per several requests).
  Hits skip prefill work but still count as used blocks once admitted. A restart empties it.

Time advances by events, not steps. Between batch changes every step is identical, so the
engine runs them as one "run" of `m` steps: decode progress of the whole batch is one step
counter, completions wait in a heap keyed by the counter value at which each request emits
its last token, and KV growth of the batch is computed in closed form from each sequence's
position within its last block. A run ends at the next completion, the step where KV runs
out, or the first step boundary after a request arrives at an engine with room. Each run is
reported once as `EngineSteps`, so the cost grows with requests, not with steps.

Token accounting follows vLLM: a request's first token comes from the step that finishes its
prefill; each later token comes from one step in which it is counted in `decode_seqs` (a
preempted request's recompute step counts, since it emits a token). Over a request's life the
steps report exactly completion_tokens - 1 decode iterations for it.

Size: over 500 lines on purpose: one state machine (step runs, KV blocks, the prefix cache,
preemption) whose invariants cross every method; mypyc compiles it as one hot module
(emulator/native.py), and the property tests hold it whole to a step-by-step oracle.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Protocol

from servewatch.emulator.engine_params import EngineParams
from servewatch.emulator.records import EngineSteps, FinishedReason, FinishedRequest, ReplicaState
from servewatch.emulator.workload import PrefixSegment, RequestSpec

# EngineParams lives in emulator/engine_params.py and is re-exported: callers build an engine
# from this module alone.
__all__ = ["EngineParams", "FinishedCallback", "PrefixCache", "ReplicaEngine", "StepObserver"]


class StepObserver(Protocol):
    def engine_steps(self, record: EngineSteps) -> None: ...


FinishedCallback = Callable[[RequestSpec, FinishedRequest, float], None]


class PrefixCache:
    """Resident prefix blocks per chain key, least recently used first."""

    def __init__(self, block_tokens: int) -> None:
        self._block = block_tokens
        self._chains: OrderedDict[str, int] = OrderedDict()
        self.blocks = 0

    def match(self, prefix: tuple[PrefixSegment, ...], limit_blocks: int) -> int:
        """Full blocks of `prefix` resident, counted along the chain until the first miss."""
        block = self._block
        chains = self._chains
        hit = 0
        start_b = 0
        for segment in prefix:
            end_b = segment.end_tokens // block
            want = end_b - start_b
            have = chains.get(segment.key, 0)
            if have:
                chains.move_to_end(segment.key)
            if have < want:
                hit += have
                break
            hit += want
            start_b = end_b
        return min(hit, limit_blocks)

    def insert(self, prefix: tuple[PrefixSegment, ...], *, last_end_tokens: int = 0) -> None:
        """Mark all full blocks of `prefix` resident; the last segment may reach further."""
        block = self._block
        chains = self._chains
        start_b = 0
        last = len(prefix) - 1
        for i, (key, end_tokens) in enumerate(prefix):
            end_b = end_tokens // block
            want = (
                (end_tokens if end_tokens > last_end_tokens else last_end_tokens) // block
                if i == last
                else end_b
            ) - start_b
            have = chains.get(key, 0)
            if want > have:
                self.blocks += want - have
                chains[key] = want
            if want > 0 or have:
                chains.move_to_end(key)
            start_b = end_b

    def extend_last(self, prefix: tuple[PrefixSegment, ...], end_tokens: int) -> None:
        """Mark the last segment of `prefix` resident up to `end_tokens` (an answer's end)."""
        key = prefix[-1][0]
        start_b = prefix[-2][1] // self._block if len(prefix) > 1 else 0
        want = end_tokens // self._block - start_b
        chains = self._chains
        have = chains.get(key, 0)
        if want > have:
            self.blocks += want - have
            chains[key] = want
        if want > 0 or have:
            chains.move_to_end(key)

    def evict_to(self, limit_blocks: int) -> None:
        """Drop least recently used blocks, chain tails first, until at most `limit_blocks`."""
        chains = self._chains
        while self.blocks > limit_blocks and chains:
            key, have = chains.popitem(last=False)
            excess = self.blocks - max(limit_blocks, 0)
            if have > excess:
                chains[key] = have - excess
                chains.move_to_end(key, last=False)
                self.blocks -= excess
            else:
                self.blocks -= have

    def clear(self) -> None:
        self._chains.clear()
        self.blocks = 0

    def __len__(self) -> int:
        return len(self._chains)


_WAITING, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3


class _Seq:
    """Engine-side state of one request."""

    spec: RequestSpec
    prompt: int
    target: int  # tokens it will emit (its answer, cut by max_tokens and max_model_len)
    reason: FinishedReason
    state: int
    generated: int
    first_scheduled_s: float
    first_token_s: float
    cached_tokens: int
    preemptions: int
    prefill_left: int
    blocks: int  # KV blocks held while prefilling
    admit: int  # admission number: the latest admitted is preempted first
    pinned: int  # cached prefix blocks it holds
    off: int  # while decoding: context tokens = off + step counter
    phase: int  # off % block size
    finish_k: int  # step counter value at which it emits its last token

    __slots__ = (
        "admit",
        "blocks",
        "cached_tokens",
        "finish_k",
        "first_scheduled_s",
        "first_token_s",
        "generated",
        "off",
        "phase",
        "pinned",
        "preemptions",
        "prefill_left",
        "prompt",
        "reason",
        "spec",
        "state",
        "target",
    )

    def __init__(self, spec: RequestSpec, target: int, reason: FinishedReason) -> None:
        self.spec = spec
        self.prompt = spec.prompt_tokens
        self.target = target
        self.reason = reason
        self.state = _WAITING
        self.generated = 0
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        self.cached_tokens = 0
        self.preemptions = 0
        # The other fields are set on admission (prefill_left, blocks, admit, pinned) and on
        # joining the decode batch (off, phase, finish_k).


class ReplicaEngine:
    """One replica's engine, driven from outside: `submit` each arriving request (every
    arrival of an instant before advancing to it), and call `end_run()` when the clock
    reaches `next_event_s` (or `advance(t)` to process everything up to t). It reports
    through the observer's `engine_steps` and the `on_finished` callback.

    The current run is `_run_m` steps from counter `_k`: a first step starting at `_t0` (its
    own length, decode count and prefill tokens) and then identical tail steps from `_t1`.
    Usually the first step is like the others; after a prefill step that completes every
    prompt it carries, the tail is the decode steps that follow, so one event covers both.
    """

    def __init__(
        self,
        name: str,
        params: EngineParams,
        *,
        observer: StepObserver,
        on_finished: FinishedCallback,
    ) -> None:
        self.name = name
        self.params = params
        self._engine_steps = observer.engine_steps
        self._on_finished = on_finished
        self.up = True
        self.slow_factor = 1.0
        self.preemptions = 0
        # Parameters read on every event, held as plain attributes.
        self._block = params.block_size_tokens
        self._capacity = params.num_gpu_blocks
        self._budget = params.max_num_batched_tokens
        self._max_seqs = params.max_num_seqs
        self._max_model_len = params.max_model_len
        self._caching = params.enable_prefix_caching
        self._evict_slack = params.num_gpu_blocks // 100
        self._a_s = params.step_base_s
        self._b_s = params.step_per_seq_s
        self._c_s = params.step_per_prefill_token_s
        self.cache = PrefixCache(params.block_size_tokens)
        self._admitted = 0
        self._busy_s = 0.0
        self._tokens = 0
        self._snapshot_s: float | None = None
        self._reset_batch()

    def _reset_batch(self) -> None:
        self._waiting: deque[_Seq] = deque()
        self._prefilling: list[_Seq] = []
        self._running: dict[int, _Seq] = {}  # by admission number, so the last is the newest
        self._heap: list[tuple[int, int, _Seq]] = []  # (finish counter, admission number, seq)
        self._n_dec = 0
        self._phase_count = [0] * self._block
        self._kv_used = 0  # blocks held at the current run's start (counter _k)
        self._pinned = 0  # cached blocks that running requests hold
        self._k = 0  # step counter at the start of the current run
        self._t0 = 0.0  # when the current run started
        self._t1 = 0.0  # when its first step ends
        self._run_m = 0  # steps in the current run; 0 when idle
        self._first_s = 0.0
        self._first_decode = 0
        self._first_prefill = 0
        self._step_s = 0.0  # tail steps
        self._decode = 0
        self._prefill = 0
        self._run_chunks: list[tuple[_Seq, int]] = []  # prompt chunks applied at the run's end
        self._two_phase = False  # the first step differs from the tail steps
        self._emitted = 0  # steps of the current run already reported
        self.next_event_s = math.inf

    # -- what the fleet sees -------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def load(self) -> int:
        """Requests the replica holds: running plus waiting."""
        return len(self._running) + len(self._waiting)

    def submit(self, spec: RequestSpec, now_s: float) -> None:
        """Queue a request arriving now; its prompt must be shorter than max_model_len."""
        room = self._max_model_len - spec.prompt_tokens
        if room < 1:
            raise ValueError(
                f"{self.name}: request {spec.request_id} has {spec.prompt_tokens} prompt tokens, "
                f"max_model_len is {self._max_model_len}"
            )
        cap = spec.max_tokens if spec.max_tokens < room else room
        if spec.output_tokens <= cap:
            seq = _Seq(spec, spec.output_tokens, FinishedReason.STOP)
        else:
            seq = _Seq(spec, cap, FinishedReason.LENGTH)
        waiting = self._waiting
        was_empty = not waiting
        waiting.append(seq)
        if self._run_m == 0:
            if self.next_event_s == math.inf:
                # Idle: the next step starts now, once every request of this instant is in.
                self.next_event_s = now_s
        elif was_empty and self._prefill == 0 and len(self._running) < self._max_seqs:
            # A decode run ends at the next step boundary so the request can join.
            self._cut(now_s)

    def advance(self, now_s: float) -> None:
        """Process every run that ends at or before `now_s`.

        Submit every request arriving at an instant before advancing to it: the step that
        starts at that instant takes all of them.
        """
        while self.next_event_s <= now_s and self.next_event_s != math.inf:
            self.end_run()

    def flush(self, now_s: float) -> None:
        """Report the steps of the current run completed by `now_s`."""
        if self._run_m and now_s >= self._t1:
            done = min(1 + int((now_s - self._t1) / self._step_s), self._run_m)
            if done > self._emitted:
                self._emit(done)

    def set_slow_factor(self, factor: float, now_s: float) -> None:
        """Multiply step time by `factor` from the next step boundary on."""
        self.slow_factor = factor
        if self._run_m:
            self._cut(now_s)

    def set_kv_squeeze(self, factor: float, now_s: float) -> None:
        """Only `num_gpu_blocks / factor` KV blocks exist from the next step boundary on (1: all
        of them), as on a replica left with less GPU memory for its KV pool; never fewer than
        one max_model_len request needs, since vLLM would not start with fewer. The usage
        gauge is over the blocks that exist. Running requests that no longer fit are
        preempted at that boundary."""
        total = self.params.num_gpu_blocks
        floor = -(-self._max_model_len // self._block)
        self._capacity = max(math.ceil(total / factor), floor) if factor > 1 else total
        if self._run_m:
            self._cut(now_s)

    def fail_all(self, now_s: float) -> int:
        """The process died now: every request it holds ends with an error. Returns how many."""
        self.flush(now_s)
        k_now = self._k + self._emitted
        failed = [*self._running.values(), *self._waiting]
        self._reset_batch()
        self.cache.clear()
        for seq in failed:
            if seq.state == _DECODE:
                seq.generated = seq.off + k_now - seq.prompt
                if seq.first_token_s > now_s:
                    seq.first_token_s = -1.0  # joined ahead, but its prefill step never ended
            seq.state = _DONE
            self._report(seq, now_s, FinishedReason.ERROR)
        return len(failed)

    def restart(self, now_s: float) -> None:
        """Serving again after a (cold) start: empty batch, empty cache, fresh counters."""
        self._reset_batch()
        self.cache.clear()
        self.up = True
        self._busy_s = 0.0
        self._tokens = 0
        self._snapshot_s = now_s

    def snapshot(self, now_s: float) -> ReplicaState:
        """Gauges now, and busy share and token rate since the previous snapshot."""
        self.flush(now_s)
        since = self._snapshot_s
        self._snapshot_s = now_s
        busy_s, tokens = self._busy_s, self._tokens
        self._busy_s, self._tokens = 0.0, 0
        if not self.up:
            return ReplicaState(self.name, False, 0, 0, 0.0, 0.0, 0.0)
        window_s = now_s - since if since is not None else 0.0
        kv = self._kv_used + self._kv_growth(self._emitted)
        return ReplicaState(
            replica=self.name,
            up=True,
            running=len(self._running),
            waiting=len(self._waiting),
            kv_usage_ratio=min(1.0, kv / self._capacity),
            busy_ratio=min(1.0, busy_s / window_s) if window_s > 0 else 0.0,
            tokens_per_s=tokens / window_s if window_s > 0 else 0.0,
        )

    # -- the run in progress -------------------------------------------------------------

    def _emit(self, upto: int) -> None:
        """Report the run's steps from `_emitted` up to `upto` as EngineSteps."""
        done = self._emitted
        if done == 0 and self._two_phase:
            self._engine_steps(
                EngineSteps(
                    self.name, self._t0, self._first_s, 1, self._first_decode, self._first_prefill
                )
            )
            self._busy_s += self._first_s
            self._tokens += self._first_decode + self._first_prefill
            done = 1
        n = upto - done
        if n > 0:
            step_s = self._step_s
            start_s = self._t0 if done == 0 else self._t1 + (done - 1) * step_s
            self._engine_steps(
                EngineSteps(self.name, start_s, step_s, n, self._decode, self._prefill)
            )
            self._busy_s += n * step_s
            self._tokens += n * (self._decode + self._prefill)
        self._emitted = upto

    def _cut(self, now_s: float) -> None:
        """End the current run at the first step boundary at or after `now_s`."""
        t1 = self._t1
        step_s = self._step_s
        if now_s <= t1:
            m = 1
        else:
            m = 1 + math.ceil((now_s - t1) / step_s)
            # The rounded quotient can miss by one either way: settle m on the engine's own
            # boundary values, so that an arrival exactly on a boundary joins the step that
            # starts there (as the step-by-step reference has it), not the one after.
            while m > 1 and t1 + (m - 2) * step_s >= now_s:
                m -= 1
            while t1 + (m - 1) * step_s < now_s:
                m += 1
        if m < self._run_m:
            self._run_m = m
            self.next_event_s = t1 + (m - 1) * step_s

    def _kv_growth(self, steps: int) -> int:
        """Blocks the decoding sequences gain over the run's first `steps` steps."""
        if steps <= 0 or not self._n_dec:
            return 0
        block = self._block
        q, r = divmod(steps, block)
        grow = self._n_dec * q
        if r:
            # A sequence needs one more block when its last block has fewer than r free
            # slots; with phase p it has (-(p + k)) % block free slots at counter k, so the
            # phases concerned form one cyclic range.
            pc = self._phase_count
            last = (-self._k) % block
            first = (last - r + 1) % block
            if first <= last:
                grow += sum(pc[first : last + 1])
            else:
                grow += sum(pc[first:]) + sum(pc[: last + 1])
        return grow

    def _kv_steps_left(self) -> int:
        """Steps from the run's start until decode growth needs more blocks than exist."""
        n = self._n_dec
        q, rem = divmod(self._capacity - self._kv_used, n)
        block = self._block
        pc = self._phase_count
        base = self._k
        cum = 0
        for r in range(1, block):
            cum += pc[(1 - r - base) % block]
            if cum > rem:
                return block * q + r
        return block * (q + 1)

    def end_run(self) -> None:  # noqa: PLR0912, PLR0915 (the hot path, kept in one piece)
        """Process the end of the current run (at `next_event_s`) and plan the next one.

        With no run (`_run_m` 0) this only plans: an idle engine got work.
        """
        t = self.next_event_s
        m = self._run_m
        emitted = self._emitted
        if m > emitted:
            if emitted:
                self._emit(m)
            elif self._two_phase:
                # The first step and the tail, as _emit reports them, inlined.
                name = self.name
                first_s = self._first_s
                first_decode = self._first_decode
                first_prefill = self._first_prefill
                self._engine_steps(
                    EngineSteps(name, self._t0, first_s, 1, first_decode, first_prefill)
                )
                busy_s = first_s
                tokens = first_decode + first_prefill
                if m > 1:
                    n = m - 1
                    step_s = self._step_s
                    decode = self._decode
                    self._engine_steps(EngineSteps(name, self._t1, step_s, n, decode, 0))
                    busy_s += n * step_s
                    tokens += n * decode
                self._busy_s += busy_s
                self._tokens += tokens
            else:
                step_s = self._step_s
                decode = self._decode
                prefill = self._prefill
                self._engine_steps(EngineSteps(self.name, self._t0, step_s, m, decode, prefill))
                self._busy_s += m * step_s
                self._tokens += m * (decode + prefill)
        k0 = self._k
        k = k0 + m
        block = self._block
        n_dec = self._n_dec
        if n_dec:
            # Decode growth over the run (as _kv_growth computes it), inlined on the hot path.
            q, r = divmod(m, block)
            grow = n_dec * q
            if r:
                pc = self._phase_count
                last = (-k0) % block
                first = (last - r + 1) % block
                if first <= last:
                    grow += sum(pc[first : last + 1])
                else:
                    grow += sum(pc[first:]) + sum(pc[: last + 1])
            self._kv_used += grow
        self._k = k
        self._t0 = t
        heap = self._heap
        if heap and heap[0][0] <= k:
            phase_count = self._phase_count
            while heap and heap[0][0] <= k:
                finish_k, _, seq = heapq.heappop(heap)
                if seq.state != _DECODE or seq.finish_k != finish_k:
                    continue  # preempted since it was queued
                self._kv_used -= -(-(seq.off + k) // block)
                phase_count[seq.phase] -= 1
                self._n_dec -= 1
                seq.generated = seq.target
                self._complete(seq, t)
        chunks = self._run_chunks
        if chunks:
            prefilling = self._prefilling
            for seq, chunk in chunks:
                left = seq.prefill_left - chunk * m
                seq.prefill_left = left
                if left == 0:
                    prefilling.remove(seq)
                    self._prefilled(seq, k, t)
        if self._kv_used > self._capacity:
            self._preempt(k)
        self._plan(t)

    def _prefilled(self, seq: _Seq, k: int, t: float) -> None:
        """`seq`'s prefill ended with the step that brought the counter to `k` at `t`."""
        block = self._block
        seq.generated += 1
        if seq.first_token_s < 0:
            seq.first_token_s = t
        if self._caching:
            self.cache.insert(seq.spec.prefix)
            chain = seq.prompt // block
            self._pinned += chain - seq.pinned
            seq.pinned = chain
        if seq.generated >= seq.target:
            self._kv_used -= seq.blocks
            self._complete(seq, t)
            return
        seq.state = _DECODE
        off = seq.prompt + seq.generated - k
        seq.off = off
        phase = seq.phase = off % block
        self._phase_count[phase] += 1
        self._n_dec += 1
        finish_k = seq.finish_k = k + seq.target - seq.generated
        heapq.heappush(self._heap, (finish_k, seq.admit, seq))

    def _complete(self, seq: _Seq, t: float) -> None:
        """`seq` emitted its last token at `t`."""
        del self._running[seq.admit]
        seq.state = _DONE
        spec = seq.spec
        if self._caching:
            if spec.answer_extends_prefix:
                self.cache.extend_last(spec.prefix, seq.prompt + seq.target - 1)
            self._pinned -= seq.pinned
            seq.pinned = 0
        # _report's timing for a request that got its first token, inlined on the hot path.
        arrival = spec.arrival_s
        scheduled = seq.first_scheduled_s
        first_token = seq.first_token_s
        self._on_finished(
            spec,
            FinishedRequest(
                self.name,
                spec.request_id,
                spec.conversation_id,
                spec.tenant,
                arrival,
                scheduled - arrival,
                first_token - scheduled,
                t - first_token,
                seq.prompt,
                seq.cached_tokens,
                seq.generated,
                spec.max_tokens,
                seq.reason,
                seq.preemptions,
            ),
            t,
        )

    def _report(self, seq: _Seq, t: float, reason: FinishedReason) -> None:
        spec = seq.spec
        arrival = spec.arrival_s
        scheduled = seq.first_scheduled_s
        first_token = seq.first_token_s
        if scheduled < 0:
            queue_s, prefill_s, decode_s = t - arrival, 0.0, 0.0
        elif first_token < 0:
            queue_s, prefill_s, decode_s = scheduled - arrival, t - scheduled, 0.0
        else:
            queue_s, prefill_s, decode_s = (
                scheduled - arrival,
                first_token - scheduled,
                t - first_token,
            )
        record = FinishedRequest(
            self.name,
            spec.request_id,
            spec.conversation_id,
            spec.tenant,
            arrival,
            queue_s,
            prefill_s,
            decode_s,
            seq.prompt,
            seq.cached_tokens,
            seq.generated,
            spec.max_tokens,
            reason,
            seq.preemptions,
        )
        self._on_finished(spec, record, t)

    def _preempt(self, k: int) -> None:
        """Free blocks by sending the latest-admitted running requests back to the queue."""
        block = self._block
        running = self._running
        while self._kv_used > self._capacity and running:
            _, victim = running.popitem()
            if victim.state == _DECODE:
                self._kv_used -= -(-(victim.off + k) // block)
                self._phase_count[victim.phase] -= 1
                self._n_dec -= 1
                victim.generated = victim.off + k - victim.prompt
            else:
                self._kv_used -= victim.blocks
                self._prefilling.remove(victim)
            self._pinned -= victim.pinned
            victim.pinned = 0
            victim.state = _WAITING
            victim.preemptions += 1
            self.preemptions += 1
            self._waiting.appendleft(victim)

    def _admit(self, t: float, budget: int) -> None:
        """Move waiting requests into the batch, FCFS, while budget, seats and KV allow."""
        waiting = self._waiting
        block = self._block
        capacity = self._capacity
        running = self._running
        caching = self._caching
        max_seqs = self._max_seqs
        while waiting and budget > 0 and len(running) < max_seqs:
            seq = waiting[0]
            total = seq.prompt + seq.generated
            need = total // block + 1  # blocks for the tokens plus the one prefill emits
            if self._kv_used + need > capacity:
                break
            waiting.popleft()
            hit = self.cache.match(seq.spec.prefix, (total - 1) // block) if caching else 0
            self._kv_used += need
            seq.blocks = need
            left = total - hit * block
            seq.prefill_left = left
            if seq.first_scheduled_s < 0:
                seq.first_scheduled_s = t
                seq.cached_tokens = hit * block
            seq.pinned = hit
            self._pinned += hit
            seq.state = _PREFILL
            self._admitted += 1
            seq.admit = self._admitted
            running[self._admitted] = seq
            self._prefilling.append(seq)
            budget -= left

    def _plan(self, t: float) -> None:  # noqa: PLR0912, PLR0915 (one scheduling pass)
        """Schedule the run starting at step boundary `t` (counter `_k`)."""
        n_dec = self._n_dec
        budget = self._budget - n_dec
        if self._waiting and budget > 0:
            spare = budget
            if self._prefilling:
                spare -= sum(seq.prefill_left for seq in self._prefilling)
            if spare > 0:
                self._admit(t, spare)
        if self._caching:
            # Cached blocks live in the KV blocks no running request holds; eviction frees
            # a little more than needed (`_evict_slack`) so it runs once per several requests.
            limit = self._capacity - self._kv_used + self._pinned
            if self.cache.blocks > limit:
                self.cache.evict_to(limit - self._evict_slack)
        chunks: list[tuple[_Seq, int]] = []
        prefill_tokens = 0
        resumed = 0
        whole = True  # every scheduled prompt finishes in this step
        for seq in self._prefilling:
            if budget <= 0:
                whole = False
                break
            left = seq.prefill_left
            if left < budget:
                chunk = left
            else:
                chunk = budget
                whole = whole and chunk == left
            chunks.append((seq, chunk))
            budget -= chunk
            prefill_tokens += chunk
            if chunk == left and seq.generated:
                resumed += 1
        slow = self.slow_factor
        self._emitted = 0
        if not chunks:
            if not n_dec:
                self._run_m = 0
                self._prefill = 0
                self._run_chunks = chunks
                self.next_event_s = math.inf
                return
            heap = self._heap
            while True:
                finish_k, _, seq = heap[0]
                if seq.state == _DECODE and seq.finish_k == finish_k:
                    break
                heapq.heappop(heap)
            m = finish_k - self._k
            if n_dec * (-(-m // self._block)) > self._capacity - self._kv_used:
                m = min(m, self._kv_steps_left())
            step_s = (self._a_s + self._b_s * n_dec) * slow
            self._run_m = m
            self._t0 = t
            self._t1 = t1 = t + step_s
            self._first_s = self._step_s = step_s
            self._first_decode = self._decode = n_dec
            self._first_prefill = self._prefill = 0
            self._run_chunks = chunks
            self._two_phase = False
            self.next_event_s = t1 + (m - 1) * step_s
            return
        step_s = (self._a_s + self._b_s * (n_dec + len(chunks)) + self._c_s * prefill_tokens) * slow
        if whole and not resumed and (budget > 0 or not self._waiting):
            self._prefill_then_decode(t, step_s, chunks, prefill_tokens)
            return
        m = 1
        if len(chunks) == 1:
            seq, chunk = chunks[0]
            if chunk < seq.prefill_left:
                # Identical full-budget chunks of one long prompt: run them together.
                m = (seq.prefill_left - 1) // chunk
                if n_dec:
                    m = self._kv_bound(min(m, self._steps_to_completion()))
        self._set_run(
            t, m, step_s=step_s, decode=n_dec + resumed, prefill=prefill_tokens, chunks=chunks
        )

    def _set_run(
        self,
        t: float,
        m: int,
        *,
        step_s: float,
        decode: int,
        prefill: int,
        chunks: list[tuple[_Seq, int]],
    ) -> None:
        """A run of `m` identical steps from boundary `t`."""
        self._run_m = m
        self._t0 = t
        self._t1 = t + step_s
        self._first_s = self._step_s = step_s
        self._first_decode = self._decode = decode
        self._first_prefill = self._prefill = prefill
        self._run_chunks = chunks
        self._two_phase = False
        self.next_event_s = self._t1 + (m - 1) * step_s

    def _prefill_then_decode(
        self, t: float, step_s: float, chunks: list[tuple[_Seq, int]], prefill_tokens: int
    ) -> None:
        """One step finishing every scheduled prompt, then the decode steps that follow.

        Nothing can change the batch before the step ends (arrivals wait for a boundary and
        no one waiting can be admitted: the queue is empty or blocked on seats or KV, which
        this step does not free), so the prompts join the decode batch now, effective at the
        step's end, and one event covers the prefill step and the decode run after it.
        """
        n_old = self._n_dec
        # Steps to the run's first completion: an old decoder's, or a joiner's last token
        # (a joiner emits its first token at this step's end, then target - 1 more).
        m = self._steps_to_completion() if n_old else math.inf
        for seq, _ in chunks:
            m = min(m, seq.target)
        if m <= 1:
            self._set_run(t, 1, step_s=step_s, decode=n_old, prefill=prefill_tokens, chunks=chunks)
            return
        k0 = self._k
        t1 = t + step_s
        block = self._block
        phase_count = self._phase_count
        heap = self._heap
        caching = self._caching
        self._prefilling.clear()
        for seq, _ in chunks:
            # _prefilled at counter k0 + 1 and time t1, for a first prefill, inlined.
            prompt = seq.prompt
            seq.prefill_left = 0
            seq.generated = 1
            if seq.first_token_s < 0:
                seq.first_token_s = t1
            if caching:
                self.cache.insert(seq.spec.prefix)
                chain = prompt // block
                self._pinned += chain - seq.pinned
                seq.pinned = chain
            seq.state = _DECODE
            # Counted as decoding from this step's start with its prompt as context: the
            # growth formula then adds the block for its first token, if it needs one.
            off = seq.off = prompt - k0
            phase = seq.phase = off % block
            phase_count[phase] += 1
            finish_k = seq.finish_k = k0 + seq.target
            heapq.heappush(heap, (finish_k, seq.admit, seq))
            self._kv_used -= seq.blocks - (-(-prompt // block))
        self._n_dec = n_dec = n_old + len(chunks)
        m = self._kv_bound(int(m))
        tail_s = (self._a_s + self._b_s * n_dec) * self.slow_factor
        self._run_m = m
        self._t0 = t
        self._t1 = t1
        self._first_s = step_s
        self._first_decode = n_old
        self._first_prefill = prefill_tokens
        self._step_s = tail_s
        self._decode = n_dec
        self._prefill = 0
        self._run_chunks = []
        self._two_phase = True
        self.next_event_s = t1 + (m - 1) * tail_s

    def _steps_to_completion(self) -> int:
        heap = self._heap
        while True:
            finish_k, _, seq = heap[0]
            if seq.state == _DECODE and seq.finish_k == finish_k:
                return finish_k - self._k
            heapq.heappop(heap)

    def _kv_bound(self, m: int) -> int:
        # Each decoding sequence gains at most ceil(m / block) blocks in m steps.
        if self._n_dec * (-(-m // self._block)) <= self._capacity - self._kv_used:
            return m
        return min(m, self._kv_steps_left())
