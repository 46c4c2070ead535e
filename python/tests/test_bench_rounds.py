"""The harness's timing rounds (flamia.bench.Timer.run) on stand-in implementations and a
stand-in CUDA event clock (no GPU): the implementations take turns every round, each round in
its own order; each phase's time is the median over the rounds, each round's time kept beside
it; one that raises leaves the rounds with its error while the others are still timed; the
sustained runs (--sustained) come after the rounds, each from its own medians."""
import types

import pytest

from flamia import bench


class Clock:
    """CUDA events that read a counter the stand-in calls advance by their cost."""

    def __init__(self):
        self.now = 0.0
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = clock.now

            def elapsed_time(self, end):
                return end.t - self.t

        self.cuda = types.SimpleNamespace(Event=Event, synchronize=lambda: None)


class Stub(bench.Impl):
    def __init__(self, name, clock, log, costs, has_quant=False, fail=None):
        self.name, self.clock, self.log, self.costs, self.has_quant = name, clock, log, costs, has_quant
        self.fail = fail  # (phase, call number) that raises
        self.calls = {}

    def _call(self, phase):
        n = self.calls[phase] = self.calls.get(phase, 0) + 1
        if self.fail == (phase, n):
            raise RuntimeError(f"{self.name} {phase} failed")
        self.log.append(f"{self.name}.{phase}")
        cost = self.costs[phase]
        self.clock.now += cost(n) if callable(cost) else cost

    def quant(self):
        self._call("quant")

    def fwd(self):
        self._call("fwd")
        return "state"

    def bwd(self, state):
        assert state == "state"
        self._call("bwd")


def timer(clock, iters, warmup=0):
    t = object.__new__(bench.Timer)
    t.iters, t.warmup, t.sustained_s, t.nvml, t.torch = iters, warmup, 0.0, None, clock
    t._pre = lambda: None
    return t


def test_implementations_take_turns_in_changing_orders_and_phases_are_medians_over_rounds():
    clock, log = Clock(), []
    # a's forward calls cost 1, 1, 5, 5, 2, 2, then 1 ms (by call number).
    a = Stub("a", clock, log, {"quant": 0.5, "fwd": lambda n: [1.0, 1.0, 5.0, 5.0, 2.0, 2.0][n - 1] if n <= 6 else 1.0,
                                "bwd": 3.0}, has_quant=True)
    b = Stub("b", clock, log, {"fwd": 4.0, "bwd": 6.0})
    res = timer(clock, iters=3, warmup=1).run([a, b])
    warm = ["a.fwd", "a.bwd", "a.quant", "b.fwd", "b.bwd"]
    turn_a = ["a.quant", "a.fwd", "a.fwd", "a.bwd", "a.fwd", "a.bwd"]  # quant, fwd, bwd (its fwd untimed), step
    turn_b = ["b.fwd", "b.fwd", "b.bwd", "b.fwd", "b.bwd"]
    # The rounds' orders (seeded): a first, then b first twice — no implementation always
    # follows the same one.
    assert log == warm + turn_a + turn_b + turn_b + turn_a + turn_b + turn_a
    assert res[1] == {"quant_ms": None, "fwd_ms": 4.0, "bwd_ms": 6.0, "step_ms": 10.0,
                      "rounds_ms": {"fwd": [4.0] * 3, "bwd": [6.0] * 3, "step": [10.0] * 3}}
    assert res[0]["quant_ms"] == 0.5 and res[0]["bwd_ms"] == 3.0
    assert res[0]["rounds_ms"]["fwd"] == [1.0, 2.0, 1.0] and res[0]["rounds_ms"]["step"] == [8.0, 4.0, 4.0]
    # a's timed forwards are its calls 2, 5, 8 (warm-up 1; each round also forms bwd's state
    # and the step's forward): costs 1, 2, 1 — the median 1; its steps' forwards (calls 4, 7,
    # 10) 5, 1, 1.
    assert res[0]["fwd_ms"] == 1.0 and res[0]["step_ms"] == pytest.approx(4.0)


def test_a_raising_implementation_leaves_the_rounds_with_its_error():
    clock, log = Clock(), []
    a = Stub("a", clock, log, {"fwd": 1.0, "bwd": 2.0}, fail=("bwd", 1))  # its first timed backward raises
    b = Stub("b", clock, log, {"fwd": 4.0, "bwd": 6.0})
    res = timer(clock, iters=2).run([a, b])
    assert res[0] == {"error": "RuntimeError: a bwd failed"}
    assert res[1]["step_ms"] == 10.0 and res[1]["rounds_ms"]["step"] == [10.0, 10.0]
    assert log.count("b.bwd") == 4 and "a.bwd" not in log  # b timed in both rounds, a in none after


def test_sustained_runs_follow_every_round_with_each_ones_medians():
    clock, log = Clock(), []
    a = Stub("a", clock, log, {"fwd": 1.0, "bwd": 2.0})
    b = Stub("b", clock, log, {"fwd": 4.0, "bwd": 6.0})
    t = timer(clock, iters=2)
    t.sustained_s = 1.0
    t.sustained = lambda impl, step_ms, fwd_ms: (log.append(f"{impl.name}.sustained"),
                                                 {"step_hint": step_ms, "fwd_hint": fwd_ms})[1]
    res = t.run([a, b])
    assert log[-2:] == ["a.sustained", "b.sustained"] and log.count("a.sustained") == 1
    assert res[0]["sustained"] == {"step_hint": 3.0, "fwd_hint": 1.0}
    assert res[1]["sustained"] == {"step_hint": 10.0, "fwd_hint": 4.0}
