"""Eviction policies on realistic prefix-cache traces: graph vs LRU vs ARC, plus the advisor's scale figures.

    python benchmarks/policies.py              # hit-rate table (6 trace families × 11 capacities), PNG plot
    python benchmarks/policies.py --quick      # smaller traces
    python benchmarks/policies.py --seed 1     # other traces of the same families
    python benchmarks/policies.py --scale      # 250k blocks / ~1M edges: advisor cycle, hot-path read, memory
    python benchmarks/policies.py --trace ../shared/traces/synthetic_trace.jsonl   # a Mooncake-format trace

A trace (`--trace`) is Mooncake's format: one JSON object per request with `timestamp` (ms) and `hash_ids`
(its prompt's 512-token prefix blocks; equal ids = a reusable block), replayed in timestamp order at 2, 5,
10, 20 and 40 % of its distinct blocks. Block size: one trace block (512 tokens) is one cache entry, and
the hit rate is per block. The trace records reuse only per 512-token block, so expanding each into 32
chained 16-token blocks adds no information: all 32 are requested together, and with leaves-first eviction
they would differ only by partly evicted tails (32× the replay's work for that); a capacity of N blocks
here is N × 32 of tiercache's 16-token blocks. Columns: LRU, ARC, `graph` (`replay`: ranked before each
eviction) and `graph-live` (`tiercache.graph.timed_replay`: the advisor ranking on its own schedule in the
trace's time, `EvictionConfig`'s defaults advisor_interval 0.5 s and max_stale 2 s, evictions and
admission read from its last snapshot, as the tier manager runs it), and the offline bound.

Traces (block = 16 tokens; a request is its prompt's blocks in prefix order, hashed as a chain):
- chat: a few tenants' system prompts (Zipf popularity), concurrent multi-turn sessions that grow by a user
  message per turn (the previous answer is part of the next prompt), one-off long prompts mixed in.
- rag: two system prompts, a document pool reused across sessions under Zipf popularity, follow-up
  questions, one-off long prompts mixed in.
- mixed: chat, rag and more one-off long prompts interleaved.
Loop families, whose loops outgrow the cache (recency evicts each block just before it comes back):
- turns: 24 users taking turns, each with a long context under one of 4 system prompts (`_Turns`).
- scan: a 200-document corpus read in order by one RAG session after another (`_Scan`).
- loopmix: turns, scan, chat and rag interleaved (`make_loop_trace`).
Capacity is a fraction of the trace's working set (its number of distinct blocks). The graph columns are
the policy as shipped, with its online fallback to a shadow ARC where its predictions lose
(`tiercache.graph.arc`). The offline bound is
`tiercache.graph.offline_bound` (Belady's farthest-next-use rule with bypass, reading the whole trace).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import heapq
import itertools
import json
import math
import random
import struct
import sys
import time
import tracemalloc
import zlib
from pathlib import Path

from tiercache.graph import (
    EDGE_TYPES,
    GraphEvictionAdvisor,
    KVCacheGraph,
    ScoreWeights,
    offline_bound,
    replay,
)
from tiercache.graph.arc import ShadowARC
from tiercache.graph.timed_replay import timed_replay

FRACTIONS = (0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
POLICIES = ("lru", "arc", "graph")


def _block(parent: bytes, content: str) -> bytes:
    return hashlib.blake2b(parent + content.encode(), digest_size=16).digest()


def _extend(chain: list, content: str, n: int, source: str) -> None:
    parent = chain[-1][0] if chain else b""
    for i in range(n):
        parent = _block(parent, f"{content}/{i}")
        chain.append((parent, source))


def _zipf_pick(rng: random.Random, n: int, s: float) -> int:
    weights = [1.0 / (k + 1) ** s for k in range(n)]
    return rng.choices(range(n), weights=weights)[0]


def _oneoff(rng: random.Random, prefix: list, tag: str) -> list:
    req = list(prefix)
    _extend(req, f"oneoff/{tag}", rng.randint(32, 128), "user")
    return req


class _Sessions:
    """`concurrent` live sessions; a user comes back after a think time of 0.5–1.5× `concurrent` requests.

    Each turn appends a user message to the session's history (the previous answer is already part of it):
    the request is the whole history, then the answer is appended for the next turn. Turn counts are
    heavy-tailed (Pareto): most conversations are short, a few go on for long, as in public chat logs.
    """

    user_blocks, answer_blocks, alpha, max_turns = (1, 8), (8, 40), 1.2, 40

    def __init__(self, rng: random.Random, concurrent: int) -> None:
        self.rng, self.concurrent, self.n_sessions, self.now = rng, concurrent, 0, 0.0
        self.queue: list = []
        for _ in range(concurrent):
            self._schedule(self._open(), rng.uniform(0, concurrent))

    def _open(self) -> list:
        raise NotImplementedError

    def _schedule(self, chain: list, delay: float) -> None:
        self.n_sessions += 1
        turns = min(self.max_turns, int(self.rng.paretovariate(self.alpha)))
        heapq.heappush(self.queue, (self.now + delay, self.n_sessions, chain, turns, 0))

    def next(self) -> list:
        self.now, sid, chain, turns, turn = heapq.heappop(self.queue)
        _extend(chain, f"{sid}/{turn}/user", self.rng.randint(*self.user_blocks), "user")
        request = list(chain)
        _extend(chain, f"{sid}/{turn}/assistant", self.rng.randint(*self.answer_blocks), "assistant")
        if turn + 1 < turns:
            think = self.rng.uniform(0.5, 1.5) * self.concurrent
            heapq.heappush(self.queue, (self.now + think, sid, chain, turns, turn + 1))
        else:
            self._schedule(self._open(), self.rng.uniform(0, 0.5 * self.concurrent))
        return request


class _Chat(_Sessions):
    """Multi-tenant chat: a few tenants' system prompts (Zipf popularity) under growing conversations."""

    def __init__(self, rng: random.Random, tenants: int = 6, concurrent: int = 512) -> None:
        self.system = []
        for t in range(tenants):
            chain: list = []
            _extend(chain, f"system/{t}", rng.randint(8, 32), "system")
            self.system.append(chain)
        super().__init__(rng, concurrent)

    def _open(self) -> list:
        return list(self.system[_zipf_pick(self.rng, len(self.system), 1.0)])


class _Rag(_Sessions):
    """RAG: system prompt + retrieved document(s) (Zipf over a pool) + question; follow-ups in sessions."""

    user_blocks, answer_blocks, alpha, max_turns = (1, 3), (2, 8), 2.0, 8

    def __init__(self, rng: random.Random, docs: int = 400, concurrent: int = 128) -> None:
        self.system = []
        for t in range(2):
            chain: list = []
            _extend(chain, f"rag-system/{t}", rng.randint(8, 16), "system")
            self.system.append(chain)
        self.doc_len = [rng.randint(8, 32) for _ in range(docs)]
        super().__init__(rng, concurrent)

    def _open(self) -> list:
        chain = list(self.system[self.rng.randrange(2)])
        for _ in range(1 if self.rng.random() < 0.7 else 2):
            d = _zipf_pick(self.rng, len(self.doc_len), 1.0)
            _extend(chain, f"doc/{d}", self.doc_len[d], "tool")
        return chain


class _Turns:
    """Users taking turns: each of `users` users has a long context (a document and its history) under one
    of `tenants` system prompts; every round serves each user once, in the previous round's order with two
    neighbours swapped. A turn asks a 1-block question; its 1–2-block answer joins the context."""

    def __init__(self, rng: random.Random, users: int = 24, context: tuple = (64, 160), tag: str = "turns"):
        self.rng, self.tag, self.turn, self.queue = rng, tag, 0, []
        systems = []
        for t in range(4):
            chain: list = []
            _extend(chain, f"{tag}/system/{t}", rng.randint(8, 24), "system")
            systems.append(chain)
        self.contexts = []
        for u in range(users):
            chain = list(systems[u % len(systems)])
            _extend(chain, f"{tag}/context/{u}", rng.randint(*context), "user")
            self.contexts.append(chain)
        self.order = list(range(users))
        rng.shuffle(self.order)

    def next(self) -> list:
        if not self.queue:
            for _ in range(2):
                i = self.rng.randrange(len(self.order) - 1)
                self.order[i], self.order[i + 1] = self.order[i + 1], self.order[i]
            self.queue = list(self.order)
        user, self.turn = self.queue.pop(0), self.turn + 1
        chain = self.contexts[user]
        _extend(chain, f"{self.tag}/{self.turn}/question", 1, "user")
        request = list(chain)
        _extend(chain, f"{self.tag}/{self.turn}/answer", self.rng.randint(1, 2), "assistant")
        return request


class _Scan:
    """A corpus scanned by RAG sessions: `docs` documents under one system prompt, read in corpus order by
    one session after another (the cursor wraps around: the corpus is a loop), each read asking one of two
    standard questions (the same text every pass) and 30 % of them a standard follow-up; 10 % of the reads
    pick a random document instead."""

    def __init__(self, rng: random.Random, docs: int = 200, tag: str = "scan") -> None:
        self.rng, self.cursor, self.pending = rng, 0, []
        system: list = []
        _extend(system, f"{tag}/system", rng.randint(8, 16), "system")
        self.docs = []
        for d in range(docs):
            chain = list(system)
            _extend(chain, f"{tag}/doc/{d}", rng.randint(8, 32), "tool")
            self.docs.append(chain)

    def next(self) -> list:
        if self.pending:
            return self.pending.pop()
        if self.rng.random() < 0.1:
            d = self.rng.randrange(len(self.docs))
        else:
            d, self.cursor = self.cursor, (self.cursor + 1) % len(self.docs)
        request = list(self.docs[d])
        _extend(request, f"question/{self.rng.randrange(2)}", 1, "user")
        if self.rng.random() < 0.3:
            follow = list(request)
            _extend(follow, "follow-up", 2, "user")
            self.pending.append(follow)
        return request


LOOP_REQUESTS = {"turns": 576, "scan": 1500, "loopmix": 1800}  # 24 rounds of 24 users; ~5 corpus passes


def make_loop_trace(family: str, n_requests: int, seed: int = 0) -> list[list]:
    """A trace whose loops outgrow the cache: users in turn ("turns"), a corpus scan ("scan"), or both
    interleaved with chat and RAG sessions ("loopmix": 45 % turns of 24 users, 30 % a 200-document scan,
    25 % the mixed family's traffic, with 64 chat and 32 RAG sessions at a time)."""
    rng = random.Random(seed)
    if family == "turns":
        return _take(_Turns(rng), n_requests)
    if family == "scan":
        return _take(_Scan(rng), n_requests)
    turns, scan = _Turns(random.Random(seed + 1)), _Scan(random.Random(seed + 2))
    chat, rag = _Chat(random.Random(seed + 3), concurrent=64), _Rag(random.Random(seed + 4), concurrent=32)
    trace = []
    for i in range(n_requests):
        x = rng.random()
        if x < 0.45:
            trace.append(turns.next())
        elif x < 0.75:
            trace.append(scan.next())
        elif x < 0.75 + 0.25 * 0.2:
            trace.append(_oneoff(rng, chat.system[rng.randrange(len(chat.system))], f"loopmix/{i}"))
        else:
            trace.append(chat.next() if rng.random() < 0.6 else rag.next())
    return trace


def _take(source, n: int) -> list[list]:
    return [source.next() for _ in range(n)]


def make_trace(family: str, n_requests: int, seed: int = 0) -> list[list]:
    """A trace of `n_requests` requests, each a list of (hash, source_label) in prefix order."""
    if family in LOOP_REQUESTS:
        return make_loop_trace(family, n_requests, seed)
    rng = random.Random(seed)
    chat, rag = _Chat(random.Random(seed + 1)), _Rag(random.Random(seed + 2))
    oneoff_frac = {"chat": 0.1, "rag": 0.05, "mixed": 0.2}[family]
    trace = []
    for i in range(n_requests):
        if rng.random() < oneoff_frac:
            prefix = chat.system[rng.randrange(len(chat.system))] if rng.random() < 0.5 else []
            trace.append(_oneoff(rng, prefix, str(i)))
        elif family == "chat" or (family == "mixed" and rng.random() < 0.6):
            trace.append(chat.next())
        else:
            trace.append(rag.next())
    return trace


def working_set(trace: list[list]) -> int:
    return len({h for req in trace for h, _ in req})


def run_table(
    families: tuple[str, ...], n_requests: int, weights: ScoreWeights | None, seed: int = 0
) -> dict:
    results = {}
    for family in families:
        n = round(LOOP_REQUESTS[family] * n_requests / 3000) if family in LOOP_REQUESTS else n_requests
        trace = make_trace(family, n, seed)
        results[family, "requests"] = n
        ws = working_set(trace)
        results[family, "ws"] = ws
        for frac in FRACTIONS:
            cap = max(1, round(frac * ws))
            t0 = time.perf_counter()
            for policy in POLICIES:
                r = replay(trace, policy=policy, capacity_blocks=cap, weights=weights)
                results[family, frac, policy] = r.hit_rate
            results[family, frac, "opt"] = offline_bound(trace, cap).hit_rate
            row = " ".join(f"{p}={results[family, frac, p]:.4f}" for p in (*POLICIES, "opt"))
            print(
                f"{family:6s} {frac:4.2f} cap={cap:6d} {row} ({time.perf_counter() - t0:.1f}s)",
                file=sys.stderr,
            )
    return results


def print_table(results: dict, families: tuple[str, ...]) -> list[str]:
    lines = [
        "| trace (working set, requests) | capacity | LRU | ARC | graph | graph vs best of LRU/ARC |"
        " offline bound | graph / bound |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family in families:
        for frac in FRACTIONS:
            lru, arc, graph, opt = (results[family, frac, p] for p in (*POLICIES, "opt"))
            best = max(lru, arc)
            rel = f"{(graph / best - 1) * 100:+.2f} %" if best else "n/a"
            name = f"{family} ({results[family, 'ws']:,} blocks, {results[family, 'requests']:,})"
            ratio = f"{graph / opt:.3f}" if opt else "n/a"
            lines.append(
                f"| {name} | {frac:.0%} | {lru:.4f} | {arc:.4f} | {graph:.4f} | {rel} | {opt:.4f} | {ratio} |"
            )
    print("\n".join(lines))
    return lines


def save_png(results: dict, families: tuple[str, ...], path: Path) -> None:
    """Hit rate vs capacity, one panel per trace family (a tiny PNG writer: no plotting library here)."""
    pw, h, m = 320, 260, 30
    img = [[(255, 255, 255)] * (pw * len(families)) for _ in range(h)]
    colors = {"lru": (200, 40, 40), "arc": (40, 140, 40), "graph": (30, 60, 220), "opt": (150, 150, 150)}

    def dot(x: int, y: int, c: tuple) -> None:
        for dx in (0, 1):
            for dy in (0, 1):
                if 0 <= y + dy < h and 0 <= x + dx < len(img[0]):
                    img[y + dy][x + dx] = c

    for k, family in enumerate(families):
        x0, top = k * pw + m, m // 2
        vals = [results[family, f, p] for f in FRACTIONS for p in colors]
        lo, hi = math.floor(min(vals) * 10) / 10, math.ceil(max(vals) * 10) / 10  # y axis: lo..hi
        for i in range(pw - 2 * m):  # axes: capacity 0..100 % right, hit rate lo..hi up
            dot(x0 + i, h - m, (0, 0, 0))
        for i in range(h - m - top):
            dot(x0, top + i, (0, 0, 0))
        for policy, c in colors.items():
            pts = [
                (
                    x0 + int(f * (pw - 2 * m)),
                    h - m - int((results[family, f, policy] - lo) / (hi - lo) * (h - m - top)),
                )
                for f in FRACTIONS
            ]
            for (xa, ya), (xb, yb) in itertools.pairwise(pts):
                steps = max(abs(xb - xa), abs(yb - ya), 1)
                for t in range(steps + 1):
                    dot(xa + (xb - xa) * t // steps, ya + (yb - ya) * t // steps, c)
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in img)

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", len(img[0]), h, 8, 2, 0, 0, 0)
    png = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )
    path.write_bytes(png)


TRACE_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.4)
TRACE_POLICIES = ("lru", "arc", "graph", "graph-live", "opt")


def load_trace(path: Path) -> tuple[list[list[int]], list[float]]:
    """(requests as lists of block ids, their times in seconds) of a Mooncake-format trace, in timestamp
    order (stable: requests of one timestamp keep the file's order)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["timestamp"])
    return [list(r["hash_ids"]) for r in rows], [r["timestamp"] / 1000 for r in rows]


def run_trace(path: Path, weights: ScoreWeights | None, fractions=TRACE_FRACTIONS) -> list[str]:
    """The hit-rate table of one trace at `fractions` of its distinct blocks (one trace block per entry)."""
    trace, times = load_trace(path)
    ws = len({b for req in trace for b in req})
    head = f"{path.name}: {len(trace):,} requests, {ws:,} distinct 512-token blocks, one per cache entry"
    lines = [
        head,
        "",
        "| capacity (blocks) | LRU | ARC | graph | graph-live | graph / best of LRU, ARC | live / best |"
        " offline bound | graph / bound | live / bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for frac in fractions:
        cap, t0 = max(1, round(frac * ws)), time.perf_counter()
        r = {p: replay(trace, p, cap, weights).hit_rate for p in ("lru", "arc", "graph")}
        r["graph-live"] = timed_replay(trace, times, cap, weights).hit_rate
        r["opt"] = offline_bound(trace, cap).hit_rate
        print(f"{frac:.0%} cap={cap} " + " ".join(f"{p}={r[p]:.4f}" for p in TRACE_POLICIES)
              + f" ({time.perf_counter() - t0:.1f}s)", file=sys.stderr)  # fmt: skip
        best = max(r["lru"], r["arc"])
        lines.append(
            f"| {frac:.0%} ({cap:,}) | {r['lru']:.4f} | {r['arc']:.4f} | {r['graph']:.4f}"
            f" | {r['graph-live']:.4f} | {r['graph'] / best:.3f} | {r['graph-live'] / best:.3f}"
            f" | {r['opt']:.4f} | {r['graph'] / r['opt']:.3f} | {r['graph-live'] / r['opt']:.3f} |"
        )
    print("\n".join(lines))
    return lines


def build_scale_graph(n_blocks: int, seed: int = 0) -> KVCacheGraph:
    """A graph of n_blocks: conversations off 64 shared prefixes, hits, steps, sketches and spills."""
    rng = random.Random(seed)
    g = KVCacheGraph(tiers=("vram", "dram"))
    roots = []
    for r in range(64):
        h = _block(b"", f"root/{r}")
        g.on_store(h, None, f"sys{r}", source="system")
        roots.append(h)
    recent: list[bytes] = list(roots)
    n, req = len(roots), 0
    while n < n_blocks:
        req += 1
        parent = rng.choice(roots) if rng.random() < 0.5 else rng.choice(recent)
        rid = f"r{req}"
        g.on_hit(parent, rid)
        step = [parent]
        for i in range(min(rng.randint(4, 24), n_blocks - n)):
            h = _block(parent, f"{req}/{i}")
            g.on_store(h, parent, rid, tier="vram" if rng.random() < 0.7 else "dram", source="user")
            parent = h
            step.append(h)
            n += 1
            if rng.random() < 0.1:
                g.on_sketch(h, rng.getrandbits(12))  # few distinct sketches: some are similar
        for k in range(0, len(step), 3):  # decode steps over overlapping windows of the request's blocks
            g.on_step([*step[k : k + 8], step[0]])
            g.on_step([step[0], *step[k : k + 8 : 2]])
        if rng.random() < 0.2:
            h = step[-1]
            g.on_move(h, g.tier_of(h), "dram" if g.tier_of(h) == "vram" else "vram")
        recent.append(step[-1])
        if len(recent) > 2000:
            recent.pop(rng.randrange(len(recent)))
    return g


def run_scale(n_blocks: int) -> dict:
    t0 = time.perf_counter()
    g = build_scale_graph(n_blocks)
    build_s = time.perf_counter() - t0
    adv = GraphEvictionAdvisor(g)
    gc_s = [0.0, 0.0]  # time spent in Python's cyclic GC (any generation) during the cycles

    def on_gc(phase: str, info: dict) -> None:
        gc_s[phase == "stop"] += time.perf_counter() if phase == "stop" else -time.perf_counter()

    gc.callbacks.append(on_gc)
    cycles, gc_in_cycle = [], []
    for _ in range(5):
        before = sum(gc_s)
        cycles.append(adv.refresh().cycle_s)
        gc_in_cycle.append(sum(gc_s) - before)
    gc.callbacks.remove(on_gc)
    print(
        "advisor cycles (s):",
        " ".join(f"{c:.3f} (gc {t:.3f})" for c, t in zip(cycles, gc_in_cycle, strict=True)),
    )
    cycles.sort()
    reads = []
    for _ in range(2000):
        t = time.perf_counter()
        adv.suggest_eviction(4, "vram")
        reads.append(time.perf_counter() - t)
    decide = []
    for _ in range(500):
        t = time.perf_counter()
        adv.choose_victims(4, "vram")
        decide.append(time.perf_counter() - t)
    reads.sort()
    decide.sort()
    edges = g.nx.number_of_edges()
    kinds = {k: 0 for k in EDGE_TYPES}
    for _, _, d in g.nx.edges(data=True):
        for k in d:
            kinds[k] += 1
    sample = random.Random(1).sample(list(g.nx.nodes), 10_000)
    t = time.perf_counter()
    for h in sample:
        g.on_hit(h, "bench")
    hit_us = (time.perf_counter() - t) / len(sample) * 1e6
    new = [i.to_bytes(8, "little") + b"new" for i in range(len(sample))]
    t = time.perf_counter()
    for h, parent in zip(new, sample, strict=True):
        g.on_store(h, parent, "bench")
    store_us = (time.perf_counter() - t) / len(sample) * 1e6
    t = time.perf_counter()
    for h in new:
        g.on_remove(h)  # each becomes a ghost (see tiercache.graph.reuse)
    remove_us = (time.perf_counter() - t) / len(sample) * 1e6
    chains = [[g.parent_of(h) or h, h] for h in sample]  # two-block requests through the shadow ARC
    t = time.perf_counter()
    for chain in chains:
        g.on_request(chain)
    request_us = (time.perf_counter() - t) / len(chains) * 1e6
    del adv, g, new
    tracemalloc.start()  # memory: the same graph built again under tracemalloc (timings above without it)
    g = build_scale_graph(n_blocks)
    mem, _ = tracemalloc.get_traced_memory()
    for i in range(int(g.reuse.ghost_factor * len(g))):  # a full ghost list: `ghosts` × the blocks cached
        g.reuse.evicted(i.to_bytes(16, "little"), 0, len(g))  # 16-byte hashes, as blake2b digests
    ghost_mem = tracemalloc.get_traced_memory()[0] - mem
    before = tracemalloc.get_traced_memory()[0]
    shadow = ShadowARC()  # a full shadow ARC: T1 + T2 hold as many blocks as cached, B1 + B2 as many ghosts
    shadow.grow(len(g))
    for i in range(2 * len(g)):
        shadow.process([i.to_bytes(16, "little")], ())
    shadow_mem = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {
        "blocks": len(g),
        "edges": edges,
        "edge_kinds": kinds,
        "build_s": build_s,
        "cycle_median_s": cycles[2],
        "cycle_max_s": cycles[-1],
        "read_median_us": reads[len(reads) // 2] * 1e6,
        "read_p99_us": reads[int(len(reads) * 0.99)] * 1e6,
        "decide_median_us": decide[len(decide) // 2] * 1e6,
        "on_hit_us": hit_us,
        "on_store_us": store_us,
        "on_remove_us": remove_us,
        "bytes_per_block": mem / len(g),
        "ghost_bytes_per_block": ghost_mem / len(g),
        "shadow_bytes_per_block": shadow_mem / len(g),
        "on_request_us": request_us,
        "numpy_bytes_per_block": g.table.nbytes() / len(g),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller traces")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--scale", action="store_true", help="advisor cycle / hot-path read / memory per block")
    ap.add_argument("--blocks", type=int, default=250_000, help="graph size for --scale")
    ap.add_argument("--weights", default=None, help="ScoreWeights as JSON, e.g. '{\"hits\": 2}'")
    ap.add_argument("--seed", type=int, default=0, help="trace generator seed (the table uses 0)")
    ap.add_argument("--trace", type=Path, default=None, help="a Mooncake-format trace (.jsonl) to replay")
    args = ap.parse_args(argv)
    if args.trace:
        run_trace(args.trace, ScoreWeights(**json.loads(args.weights)) if args.weights else None)
        return
    if args.scale:
        r = run_scale(args.blocks)
        print(
            f"blocks {r['blocks']:,}  edges {r['edges']:,}  {r['edge_kinds']}  (built in {r['build_s']:.1f}s)"
        )
        print(f"advisor cycle: median {r['cycle_median_s']:.3f}s, max {r['cycle_max_s']:.3f}s (of 5)")
        print(
            f"hot-path read suggest_eviction(4): median {r['read_median_us']:.1f}us,"
            f" p99 {r['read_p99_us']:.1f}us;"
            f" choose_victims(4) median {r['decide_median_us']:.1f}us"
        )
        print(
            f"notifications: on_hit {r['on_hit_us']:.1f}us, on_store {r['on_store_us']:.1f}us,"
            f" on_remove {r['on_remove_us']:.1f}us (mean, 10k); on_request (2 blocks, shadow ARC)"
            f" {r['on_request_us']:.1f}us"
        )
        print(
            f"memory per block: {r['bytes_per_block']:.0f} B (tracemalloc, graph + counters + edges);"
            f" numpy counters {r['numpy_bytes_per_block']:.0f} B of it; a full ghost list (`ghosts` ×"
            f" the blocks cached) adds {r['ghost_bytes_per_block']:.0f} B per cached block, the full"
            f" shadow ARC (tiercache.graph.arc) {r['shadow_bytes_per_block']:.0f} B"
        )
        return
    n = args.requests or (600 if args.quick else 3000)
    weights = ScoreWeights(**json.loads(args.weights)) if args.weights else None
    families = ("chat", "rag", "mixed", *LOOP_REQUESTS)
    results = run_table(families, n, weights, args.seed)
    out = Path(__file__).with_suffix(".png")
    save_png(results, families, out)
    print(
        f"\n{n} requests per trace, loop families as listed (seed {args.seed});"
        f" plot (red LRU, green ARC, blue graph, grey offline bound): {out}\n"
    )
    print_table(results, families)


if __name__ == "__main__":
    main()
