"""Stream batches through the stage pools with Ray actors, ObjectRefs and ``ray.wait``.

Each batch moves read → every stage of the chain in order → write. The driver only passes
ObjectRefs from call to call (``fetch_local=False``): document data never reaches it.
A batch advances to the next stage when its previous call finished and the dispatcher
grants a replica slot (pipeline/run/dispatch.py: GPU first, CPU when the GPU replicas are
saturated, else the batch waits here); at most ``max_batches`` batches are between read
and write at once, so memory stays bounded whatever the corpus size. The driver tells the
dispatcher when it submitted and when it saw each call finish, which is how the policy
learns each replica's service time. A batch spilled to a CPU pool may run there as
slices, joined by the step after (pipeline/run/slices.py): the executor cuts the call, queues
the slices for CPU slots, and hands the next step every slice's ref once all finished.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError

from docintel.actors.metrics import RunMetrics
from docintel.actors.resources import task_options
from docintel.pipeline.batch import Batch
from docintel.pipeline.errors import RunFailed
from docintel.pipeline.input.source import WorkUnit, read_unit
from docintel.pipeline.output.sink import BatchStats, RunSink
from docintel.pipeline.run.dispatch import Dispatcher, Replica
from docintel.pipeline.run.pieces import Pieces, Split, passed_on, piece_id, take
from docintel.pipeline.run.slices import SliceSizer, join

READ = "read"
WRITE = "write"
# A batch whose chain fails (after Ray's own actor restarts and task retries) is re-run
# from its read this many times before the run fails: enough for a node loss, not a loop.
MAX_BATCH_ATTEMPTS = 3
WAIT_TIMEOUT_S = 1.0  # how often the loop wakes with nothing finished (progress refresh)

log = logging.getLogger(__name__)


def _read(fs: Any, unit: WorkUnit, id_col: str, text_col: str, batch_size: int) -> Any:
    batches = read_unit(fs, unit, id_col, text_col, batch_size)
    return batches[0] if len(batches) == 1 else tuple(batches)


_read_task = ray.remote(_read)


def _write(
    sink: RunSink, batch: Batch | Pieces | Split, piece: int = -1, *more: Batch | Split
) -> BatchStats | Split:
    """A write task: the run's sink (resolved from its ref) writes one finished batch (a
    batch that split: the :class:`Split` marker, for the driver to hand out its pieces;
    ``more``: the last stage ran as slices, joined first)."""
    if more:
        batch = join((batch, *more))  # type: ignore[arg-type]
    marker = passed_on(batch, piece)
    return marker if marker is not None else sink.write(take(batch, piece))


_write_task = ray.remote(_write)


@dataclass
class _Flight:
    batch_id: str
    read_ref: ray.ObjectRef  # kept so a failed chain can restart from the read
    attempts: int = 1
    pools: dict[str, str] = field(default_factory=dict)  # stage -> pool that served it
    piece: int = -1  # a piece of a split batch (pipeline/run/pieces.py): its index
    split_ref: ray.ObjectRef | None = None  # the splitting stage's result (its pieces)


@dataclass
class _Sliced:
    """One stage call of a batch run as ``k`` slices on the CPU pool (pipeline/run/slices.py):
    the slices' result refs, in order, as they finish; the next step gets all of them."""

    flight: _Flight
    stage: str
    refs: list[ray.ObjectRef | None]  # one per slice, filled as they finish
    left: int

    @property
    def k(self) -> int:
        return len(self.refs)


# what a queued step is given: one ref, or the refs of a sliced call's results
Input = ray.ObjectRef | tuple[ray.ObjectRef, ...]
# a call in flight: its batch, its step, the replica (None: read/write), the slice it is
Call = tuple[_Flight, str, Replica | None, tuple[_Sliced, int] | None]


@dataclass(frozen=True)
class Sink:
    """The run's sink (pipeline/output/sink.py), put in the object store once per run: each write
    task is handed this ref, not a copy of the sink pickled into every task."""

    ref: ray.ObjectRef  # of a RunSink

    @classmethod
    def of(cls, sink: RunSink) -> Sink:
        return cls(ray.put(sink))


class _Pending(dict[ray.ObjectRef, Call]):
    """The calls in flight (ref -> :data:`Call`), with the list of their refs
    kept in step (swap-remove, O(1) per event) for ``ray.wait``: the list is never rebuilt
    from every pending ref as batches come and go."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[ray.ObjectRef] = []
        self._at: dict[ray.ObjectRef, int] = {}

    def __setitem__(self, ref: ray.ObjectRef, value: Call) -> None:
        if ref not in self._at:
            self._at[ref] = len(self.refs)
            self.refs.append(ref)
        super().__setitem__(ref, value)

    def pop(self, ref: ray.ObjectRef) -> Call:  # type: ignore[override]
        i = self._at.pop(ref)
        last = self.refs.pop()
        if i < len(self.refs):
            self.refs[i] = last
            self._at[last] = i
        return super().pop(ref)


@dataclass
class _Loop:
    """The executor loop's state for one run."""

    queues: dict[str, deque[tuple[_Flight, Input, float]]]
    todo: Iterator[WorkUnit]  # units not yet admitted
    skip: set[str]  # batches committed by an earlier invocation
    unit: WorkUnit | None = None  # the next unit to admit
    admitted: int = 0  # batches between read and write
    pending: _Pending = field(default_factory=_Pending)
    live: dict[str, _Flight] = field(default_factory=dict)  # admitted, not yet written


class Executor:
    def __init__(
        self,
        actors: dict[str, Any],
        dispatcher: Dispatcher,
        source_fs: Any,
        id_column: str,
        text_column: str,
        batch_size: int,
        sink: Sink,
        io_cpus: float,
        max_batches: int,
        on_tick: Callable[[float], None] | None = None,
        metrics: RunMetrics | None = None,
        wake: Callable[[], list[ray.ObjectRef]] | None = None,
        split_stage: str | None = None,
        slicing: bool = True,
    ) -> None:
        self.actors = actors  # replica key -> actor handle
        self.dispatcher = dispatcher
        # the chain in order (the dispatcher's pools are keyed by it), and where a batch
        # goes after each step: read -> first stage -> ... -> last stage -> write
        self.stages = list(dispatcher.pools)
        steps = [READ, *self.stages, WRITE]
        self.after = dict(itertools.pairwise(steps))
        # the stage that makes sentence rows splits a batch over the bound into pieces
        # (pipeline/run/pieces.py); the step after it is told which piece each call serves
        self.split_stage = split_stage if split_stage in self.stages else None
        self.takes_piece = self.after[split_stage] if self.split_stage else None
        self.source_fs = source_fs
        self.id_column = id_column
        self.text_column = text_column
        self.batch_size = batch_size
        self.sink = sink
        self.io_cpus = io_cpus
        # batches between read and write at once; 0 = two per replica slot, recounted as
        # replicas join and leave
        self.max_batches = max_batches
        self.on_tick = on_tick  # the pool manager's poll: joins, leaves, starvation
        # refs whose completion should wake the loop: replicas still loading their model
        # (the run starts before every replica is ready; a batch waits for its stage's)
        self.wake = wake
        self.metrics = metrics
        self.first_call: float | None = None  # perf_counter of the first replica call
        # Seconds batches spent ready for a stage but held on the driver (no slot granted),
        # from when the stage's first replicas joined (monotonic, in ``opened``).
        self.held_s: Counter[str] = Counter()
        self.opened: dict[str, float] = {}
        # Per stage, the admitted batches not yet submitted to it (the dispatcher's outlook
        # once the input is exhausted: pipeline/run/dispatch.py, rule 4), kept up to date as
        # batches are admitted, submitted and retried: O(1) per event.
        self.unsubmitted: Counter[str] = Counter()
        # Spilled calls cut into slices sized for the CPU replica (pipeline/run/slices.py):
        # per stage, the slices waiting for a CPU slot, and how many slices a batch gets.
        self.slicing, self.sizer = slicing, SliceSizer()
        self.slice_queue: dict[str, deque[tuple[_Sliced, int, Input]]] = {
            s: deque() for s in self.stages
        }
        # the read and write tasks with their options, made once (not per batch)
        self._write_remote = _write_task.options(**task_options(io_cpus))
        self._read_remotes: dict[int, Any] = {}

    def _launch_read(self, unit: WorkUnit) -> list[ray.ObjectRef]:
        n = len(unit.batch_ids)
        read = self._read_remotes.get(n)
        if read is None:
            read = self._read_remotes[n] = _read_task.options(**task_options(self.io_cpus, n))
        refs = read.remote(self.source_fs, unit, self.id_column, self.text_column, self.batch_size)
        return [refs] if len(unit.batch_ids) == 1 else list(refs)

    def run(
        self,
        units: Iterable[WorkUnit],
        skip: set[str],
        on_batch: Callable[[BatchStats], None],
    ) -> list[BatchStats]:
        """Process every batch of ``units`` not in ``skip``; return the stats of each."""
        st = _Loop(
            queues={s: deque() for s in (*self.stages, WRITE)},
            todo=(u for u in units if not all(b in skip for b in u.batch_ids)),
            skip=skip,
        )
        st.unit = next(st.todo, None)
        done: list[BatchStats] = []
        while True:
            if self.on_tick:  # the pool manager: joins, leaves, starvation
                self.on_tick(time.monotonic())
            self._admit(st)
            self._dispatch(st.queues, st.pending, time.monotonic())
            ready = self._wait(st)
            if ready is None:
                break
            now = time.monotonic()  # one timestamp per poll: see Dispatcher.release
            for stats in self._settle(ready, st, now):
                st.live.pop(stats.batch_id, None)
                st.admitted -= 1
                done.append(stats)
                on_batch(stats)
        replicas, held = self.dispatcher.stats(), dict(self.held_s)
        log.info(
            "dispatch: %s; held on the driver (s): %s",
            replicas,
            held,
            extra={"replicas": replicas, "held_s": held},
        )
        return done

    def _admit(self, st: _Loop) -> None:
        """Start the reads of the next units while their batches fit under the cap (or,
        a unit bigger than the cap, when nothing else is in flight)."""
        cap = self.max_batches or 2 * sum(self.dispatcher.slots(s) for s in self.stages)
        while st.unit is not None and (
            st.admitted == 0 or st.admitted + len(st.unit.batch_ids) <= cap
        ):
            unit = st.unit
            for batch_id, ref in zip(unit.batch_ids, self._launch_read(unit), strict=True):
                if batch_id in st.skip:
                    continue
                # a batch enters the first stage's queue when its read finished, so the
                # dispatcher times replica calls, not reads
                flight = _Flight(batch_id, ref)
                st.pending[ref] = (flight, READ, None, None)
                st.live[batch_id] = flight
                st.admitted += 1
                self.unsubmitted.update(self.stages)
            st.unit = next(st.todo, None)
        if st.unit is None:  # every batch admitted: the dispatcher may plan the drain
            self.dispatcher.set_outlook(True, self.unsubmitted)

    def _wait(self, st: _Loop) -> list[ray.ObjectRef] | None:
        """The calls that finished (maybe none, after WAIT_TIMEOUT_S); None when every
        batch is written."""
        wake = self.wake() if self.wake else []
        if not st.pending:
            if not any(st.queues.values()) and not any(self.slice_queue.values()):
                return None
            # batches wait for a replica of their stage: one still loading its model
            # (wake), or every one left with its node; the pool manager (on_tick) joins
            # them, starts new ones, or fails the run in time
            if wake:
                ray.wait(wake, num_returns=1, timeout=WAIT_TIMEOUT_S, fetch_local=False)
            else:
                time.sleep(WAIT_TIMEOUT_S)
            return []
        refs = st.pending.refs
        ready, _ = ray.wait(
            [*refs, *wake] if wake else refs,
            num_returns=1,
            timeout=WAIT_TIMEOUT_S,
            fetch_local=False,
        )
        if ready:  # collect everything else that finished meanwhile, without blocking
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        return ready

    def _settle(self, ready: list[ray.ObjectRef], st: _Loop, now: float) -> list[BatchStats]:
        """Move finished calls on to their next stage; the batches written."""
        written, queues = [], st.queues
        for done in ready:
            flight, stage, replica, part = st.pending.pop(done)
            ref: Input | None = done
            if replica is not None:
                sample = self.dispatcher.release(replica, now)
                if self.metrics:
                    self.metrics.call_done(stage, replica.pool, self._spilled(replica))
                if part is not None:
                    ref = self._slice_done(part, done, sample)
            if ref is None:
                continue  # other slices of the call still running
            if stage != WRITE:
                if stage == self.split_stage and flight.piece < 0:
                    flight.split_ref = ref  # its pieces, if it split (the write says)
                queues[self.after[stage]].append((flight, ref, now))
                continue
            stats = self._finish(flight, ref, st, now)
            if stats is not None:
                written.append(stats)
                if self.metrics:
                    self.metrics.batch_written(
                        flight.pools, stats.sentences, stats.documents, stats.errors
                    )
        if self.metrics:
            for s in self.stages:
                self.metrics.held(s, len(queues[s]))
        return written

    def _fan_out(self, st: _Loop, flight: _Flight, n: int, now: float) -> None:
        """A batch that split into ``n`` pieces goes on from the splitting stage's result as
        ``n`` batches (less the pieces a resumed run already committed)."""
        ref, nxt = flight.split_ref, self.after[self.split_stage]
        later = self.stages[self.stages.index(self.split_stage) + 1 :]
        st.live.pop(flight.batch_id, None)
        st.admitted -= 1
        for i in range(n):
            pid = piece_id(flight.batch_id, i, n)
            if pid in st.skip:
                continue
            piece = _Flight(pid, flight.read_ref, flight.attempts, dict(flight.pools), i)
            st.live[pid] = piece
            st.admitted += 1
            self.unsubmitted.update(later)
            st.queues[nxt].append((piece, ref, now))

    def _slice_done(
        self, part: tuple[_Sliced, int], ref: ray.ObjectRef, sample: float | None
    ) -> tuple[ray.ObjectRef, ...] | None:
        """A slice of a sliced call finished: the refs of every slice once all have."""
        sliced, i = part
        if sample is not None:
            self.sizer.note(sliced.stage, sample, sliced.k)
        sliced.refs[i] = ref
        sliced.left -= 1
        return tuple(sliced.refs) if sliced.left == 0 else None  # type: ignore[arg-type]

    def _piece(self, step: str, flight: _Flight) -> int:
        """The piece a call of ``step`` serves: the step after the splitting stage is told."""
        return flight.piece if step == self.takes_piece else -1

    def _call(self, stage: str, flight: _Flight, ref: Input, handle: Any) -> Any:
        """One replica call on ``ref`` (a sliced previous stage: all its slices' refs)."""
        refs = ref if isinstance(ref, tuple) else (ref,)
        return handle.process.remote(refs[0], self._piece(stage, flight), *refs[1:])

    def _dispatch(self, queues: dict[str, deque], pending: dict, now: float) -> None:
        for stage in self.stages:
            q = queues[stage]
            if stage not in self.opened and self.dispatcher.pools[stage]:
                self.opened[stage] = now  # its replicas joined (models loaded)
            self._dispatch_slices(stage, pending, now)
            if q and self.slicing:
                self._size_slices(stage)
            while q:
                replica = self.dispatcher.acquire(stage, now)
                if replica is None:
                    break
                flight, ref, ready_at = q.popleft()
                flight.pools[stage] = replica.pool
                self.unsubmitted[stage] -= 1
                # held for a slot; not the start-up wait for the stage's models to load
                ready_at = max(ready_at, self.opened[stage])
                if self.first_call is None:
                    self.first_call = time.perf_counter()
                self.held_s[stage] += now - ready_at
                k = self.dispatcher.slices.get(stage, 1)
                if k > 1 and self._spilled(replica) and stage != self.split_stage:
                    self._slice(stage, flight, ref, k, replica, pending)
                    self._dispatch_slices(stage, pending, now)
                    continue
                out = self._call(stage, flight, ref, self.actors[replica.key])
                pending[out] = (flight, stage, replica, None)
        q = queues[WRITE]
        while q:
            flight, ref, _ = q.popleft()
            refs = ref if isinstance(ref, tuple) else (ref,)
            out = self._write_remote.remote(
                self.sink.ref, refs[0], self._piece(WRITE, flight), *refs[1:]
            )
            pending[out] = (flight, WRITE, None, None)

    def _size_slices(self, stage: str) -> None:
        """How many slices the stage's next spilled batch gets (the dispatcher counts them
        in its rules 1 and 4): none for a stage without both pools."""
        pools = self.dispatcher.pools[stage]
        gpu = [r.service_s for r in pools if r.pool == "gpu" and r.service_s is not None]
        if stage == self.split_stage or not any(r.pool == "gpu" for r in pools):
            return
        gpu_s = sum(gpu) / len(gpu) if gpu else None
        docs = self.batch_size if isinstance(self.batch_size, int) else 0
        self.dispatcher.slices[stage] = self.sizer.slices(stage, gpu_s, docs)

    def _slice(
        self, stage: str, flight: _Flight, ref: Input, k: int, replica: Replica, pending: dict
    ) -> None:
        """Send a spilled call as ``k`` slices: the first on ``replica`` (its slot taken),
        the rest queued for the CPU pool's next free slots."""
        sliced = _Sliced(flight, stage, [None] * k, k)
        self._submit_slice(sliced, 0, ref, replica, pending)
        self.slice_queue[stage].extend((sliced, i, ref) for i in range(1, k))

    def _dispatch_slices(self, stage: str, pending: dict, now: float) -> None:
        q = self.slice_queue[stage]
        while q:
            replica = self.dispatcher.acquire_slice(stage, now)
            if replica is None:
                return
            sliced, i, ref = q.popleft()
            self._submit_slice(sliced, i, ref, replica, pending)

    def _submit_slice(
        self, sliced: _Sliced, i: int, ref: Input, replica: Replica, pending: dict
    ) -> None:
        refs = ref if isinstance(ref, tuple) else (ref,)
        piece = self._piece(sliced.stage, sliced.flight)
        out = self.actors[replica.key].process_slice.remote(i, sliced.k, piece, *refs)
        pending[out] = (sliced.flight, sliced.stage, replica, (sliced, i))

    def _finish(
        self, flight: _Flight, ref: ray.ObjectRef, st: _Loop, now: float
    ) -> BatchStats | None:
        """The batch's write result, or None after re-queueing a failed batch or handing
        out the pieces of a batch that split."""
        try:
            got = ray.get(ref)
            if isinstance(got, Split):
                self._fan_out(st, flight, got.n, now)
                return None
            return got
        except RayError as e:
            if flight.attempts >= MAX_BATCH_ATTEMPTS:
                raise RunFailed(
                    f"batch {flight.batch_id} failed {flight.attempts} times; last error: {e}"
                ) from e
            flight.attempts += 1
            self.unsubmitted.update(flight.pools.keys())  # it passes every stage again
            flight.pools.clear()
            if self.metrics:
                self.metrics.retried()
            st.queues[self.stages[0]].append((flight, flight.read_ref, time.monotonic()))
            return None

    def _spilled(self, replica: Replica) -> bool:
        """A call on a CPU replica of a stage that also has GPU replicas."""
        return replica.pool == "cpu" and any(
            r.pool == "gpu" for r in self.dispatcher.pools[replica.stage]
        )
