"""A Mooncake-format trace replayed (`benchmarks/policies.py --trace`), and the graph policy replayed with its
advisor cycling in the trace's time (`tiercache.graph.timed_replay`)."""

import importlib.util
import json
import random
from pathlib import Path

import pytest

from tiercache.graph import offline_bound, replay
from tiercache.graph.timed_replay import timed_replay

POLICIES_PY = Path(__file__).resolve().parents[2] / "benchmarks" / "policies.py"


def load_policies_benchmark():
    spec = importlib.util.spec_from_file_location("policies_benchmark", POLICIES_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mooncake_rows(seed: int, n: int = 160) -> list[dict]:
    """Multi-turn conversations in Mooncake's format: a turn resends the history (hash_ids of 512-token
    blocks) plus new blocks; Poisson arrivals (ms); a third of the requests are one-off prompts."""
    rng, next_id, t, rows, convs = random.Random(seed), 0, 0.0, [], []

    def new(k: int) -> list[int]:
        nonlocal next_id
        next_id += k
        return list(range(next_id - k, next_id))

    for _ in range(n):
        t += 1 + rng.expovariate(1 / 300)  # distinct ms: one order for the file's rows
        if rng.random() < 0.3 or not convs:
            ids = new(rng.randint(2, 12))
            if rng.random() < 0.5:
                convs.append(ids)
        else:
            k = rng.randrange(len(convs))
            ids = convs[k] = convs[k] + new(rng.randint(1, 4))
        rows.append(
            {"timestamp": int(t), "input_length": 512 * len(ids), "output_length": 8, "hash_ids": ids}
        )
    return rows


def test_trace_table_on_a_generated_mooncake_trace(tmp_path):
    rows = mooncake_rows(0)
    path = tmp_path / "trace.jsonl"
    shuffled = rows[::-1]  # out of order in the file: the replay sorts by timestamp
    path.write_text("".join(json.dumps(r) + "\n" for r in shuffled))
    bench = load_policies_benchmark()
    trace, times = bench.load_trace(path)
    assert trace == [r["hash_ids"] for r in rows] and times == [r["timestamp"] / 1000 for r in rows]
    lines = bench.run_trace(path, None, fractions=(0.05, 0.2))
    assert "one per cache entry" in lines[0] and len(lines) == 4 + 2
    for line in lines[4:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        lru, arc, graph, live, bound = (float(cells[i]) for i in (1, 2, 3, 4, 7))
        assert 0 < max(lru, arc, graph, live) <= bound


def turns(users: int, context: int, rounds: int) -> list[list[str]]:
    return [[f"{u}/{i}" for i in range(context)] for _ in range(rounds) for u in range(users)]


def test_the_advisor_schedule_decides_what_the_live_graph_keeps():
    # Users taking turns in a loop larger than the cache: LRU keeps nothing. Requests 10 s apart see a
    # snapshot ranked after the previous one, so the graph keeps a subset of the loop; a burst (one
    # timestamp) leaves the advisor no time to rank, so every eviction is the LRU fallback.
    trace, capacity = turns(8, 10, 12), 40
    assert replay(trace, "lru", capacity).blocks_hit == 0
    spaced = timed_replay(trace, [10.0 * i for i in range(len(trace))], capacity, cycle_s=0.001)
    burst = timed_replay(trace, [0.0] * len(trace), capacity, cycle_s=0.001)
    assert burst.blocks_hit == 0
    assert spaced.blocks_hit >= 0.5 * offline_bound(trace, capacity).blocks_hit > 0


@pytest.mark.parametrize("seed,capacity", [(1, 20), (2, 60)])
def test_timed_replay_is_deterministic_and_below_the_bound(seed, capacity):
    rows = mooncake_rows(seed)
    trace, times = [r["hash_ids"] for r in rows], [r["timestamp"] / 1000 for r in rows]
    a = timed_replay(trace, times, capacity, cycle_s=0.002)
    assert a == timed_replay(trace, times, capacity, cycle_s=0.002)
    assert a.blocks_requested == replay(trace, "lru", capacity).blocks_requested
    assert 0 < a.blocks_hit <= offline_bound(trace, capacity).blocks_hit


def test_timed_replay_refuses_bad_input():
    with pytest.raises(ValueError, match="capacity_blocks"):
        timed_replay([["a"]], [0.0], 0)
    with pytest.raises(ValueError, match="timestamps must not decrease"):
        timed_replay([["a"], ["b"]], [1.0, 0.5], 4)
