"""`tiercache inspect`: tier occupancy, hit rates and the latest decisions of a running tiercache.

    tiercache inspect [--socket PATH] [--decisions N] [--blocks N] [--explain HASH] [--why ID] [--json]
    tiercache inspect --list [--json]     the live sockets (one engine each), newest first

Without --socket it finds the newest live socket (see tiercache.inspect.paths). --json prints the same
content as one JSON object (block hashes as hex). Exit status 1 with one line saying what to do when no
service answers, or answers something malformed; never a traceback (exit 130 on Ctrl-C).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--socket", metavar="PATH", help="inspection socket (default: the newest live one)")
    parser.add_argument("--decisions", type=_count, default=20, metavar="N", help="latest decisions (20)")
    parser.add_argument("--blocks", type=_count, default=0, metavar="N", help="most recently used blocks (0)")
    parser.add_argument("--explain", metavar="HASH", help="why a block is where it is (hex, or a prefix)")
    parser.add_argument(
        "--why", metavar="REQUEST_ID", help="why a recent request missed, block by block (vLLM's or your id)"
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument(
        "--timeout", type=_seconds, default=5.0, metavar="S", help="seconds for each whole request (5)"
    )
    parser.add_argument("--list", action="store_true", help="list the live inspection sockets and exit")


def run(args: argparse.Namespace) -> int:
    from tiercache.inspect import InspectError

    try:
        return _list(args) if args.list else _report(args)
    except InspectError as exc:
        return _fail(str(exc))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # one line, as promised; a bug is still named
        return _fail(f"unexpected {type(exc).__name__}: {exc}; please report it (tiercache inspect --json …)")


def _report(args: argparse.Namespace) -> int:
    from tiercache.inspect import connect

    with connect(args.socket, timeout=args.timeout) as client:
        report = {"where": client.where, "stats": client.stats()}
        report["decisions"] = client.decisions(args.decisions) if args.decisions else ()
        report["blocks"] = client.blocks(limit=args.blocks) if args.blocks else ()
        if args.explain:
            report["explain"] = client.explain(args.explain)
        if args.why:
            report["why"] = client.explain_request(args.why)
    print(json.dumps(_plain(report), indent=2) if args.json else render(report))
    return 0


def _fail(message: str) -> int:
    text = " ".join(message.split())
    print(f"tiercache inspect: {text if len(text) <= 1000 else text[:999] + '…'}", file=sys.stderr)
    return 1


def _list(args: argparse.Namespace) -> int:
    from tiercache.inspect import InspectError, connect
    from tiercache.inspect.paths import live_sockets, socket_dirs

    sockets = live_sockets()
    if not sockets:
        looked = ", ".join(str(d) for d in socket_dirs())
        print(f"tiercache inspect: no live inspection sockets in {looked}", file=sys.stderr)
        return 1
    rows = []
    for path in sockets:
        try:
            with connect(path, timeout=args.timeout) as client:
                s = client.stats()
            rows.append((str(path), s.pid, s.policy, s.blocks, s.hit_rate, s.evictions))
        except InspectError as exc:
            rows.append((str(path), None, None, None, None, f"not answering: {exc}"))
    if args.json:
        keys = ("socket", "pid", "policy", "blocks", "hit_rate", "evictions")
        print(json.dumps([dict(zip(keys, row, strict=True)) for row in rows], indent=2))
    else:
        rows = [(*row[:4], _pct(row[4]), row[5]) for row in rows]
        rows = [tuple("" if cell is None else cell for cell in row) for row in rows]
        print("\n".join(_table(("SOCKET", "PID", "POLICY", "BLOCKS", "HIT RATE", "EVICTIONS"), rows)))
    return 0


def render(report: Mapping[str, Any]) -> str:
    s = report["stats"]
    lines = [
        f"tiercache @ {report['where']}  (pid {s.pid}, policy {s.policy}, codec {s.codec_id}, "
        f"snapshot {s.snapshot_age_s:.2f}s old)",
        "",
        *_table(("TIER", "STORED", "CAPACITY", "USED", "OCCUPANCY", "HITS", "EVICTED"), _tier_rows(s)),
        "",
        f"lookups:   {s.hits} block hits ({_by(s.hits_by_tier)}), {s.misses} misses"
        f" → hit rate {_pct(s.hit_rate)}",
    ]
    if s.tokens_loaded or s.tokens_recomputed:
        lines.append(
            f"tokens:    {s.tokens_loaded:,} loaded, {s.tokens_recomputed:,} recomputed "
            f"({_pct(s.token_hit_rate)} from the cache)"
        )
    if s.ttft_hit or s.ttft_miss:
        lines.append(f"ttft:      with hits {_ttft(s.ttft_hit)}; without {_ttft(s.ttft_miss)}")
    lines += [
        f"evictions: {s.evictions} ({s.evictions - s.evictions_dropped} spilled, {s.evictions_dropped} "
        f"dropped; by policy: {_by(s.evictions_by_policy) or 'none'})",
        f"admission: {s.declines} new blocks declined (by policy: {_by(s.declines_by_policy) or 'none'})",
        f"moves:     {s.spills} spills and {s.warms} warms done, {s.spill_failures + s.warm_failures} "
        f"failed, {s.jobs_in_flight} jobs in flight; {s.drops} blocks dropped after a failure",
    ]
    if s.events_dropped:
        lines.append(f"warning:   {s.events_dropped} events were not drained in time and are not counted")
    if report["decisions"]:
        lines += ["", f"latest decisions (newest first, {len(report['decisions'])})"]
        lines += _table(("AGO", "ACTION", "BLOCK", "POLICY", "SCORE", "REASON"), _decision_rows(report))
    if report["blocks"]:
        rows = [
            (b.block_hash.hex()[:16], b.tier, b.slot, b.hits, f"{b.idle_s:.1f}s", _block_state(b))
            for b in report["blocks"]
        ]
        header = ("BLOCK", "TIER", "SLOT", "HITS", "IDLE", "STATE")
        lines += ["", "most recently used blocks", *_table(header, rows)]
    if "explain" in report:
        x = report["explain"]
        lines += ["", f"explain {x.block_hash.hex()}", f"  {x.summary}"]
        if x.components:
            lines.append("  components: " + _components(x.components))
    if "why" in report:
        lines += ["", *render_why(report["why"])]
    return "\n".join(lines)


def render_why(x) -> list[str]:
    """A request's explanation: the summary, then one row per run of blocks with the same outcome."""
    lines = [f"request {x.external_id or x.request_id} ({x.age_s:.1f}s ago)", f"  {x.summary}"]
    rows, run = [], None
    for b in x.blocks:
        key = (b.outcome, b.tier, b.cause, (b.event or {}).get("policy"))
        if run is not None and run[0] == key:
            run[2] = b.index
            continue
        if run is not None:
            rows.append(_why_row(*run))
        run = [key, b, b.index]
    if run is not None:
        rows.append(_why_row(*run))
    return [*lines, "", *_table(("BLOCKS", "OUTCOME", "TIER", "CAUSE", "FIRST BLOCK", "DETAIL"), rows)]


def _why_row(key, first, last: int) -> tuple:
    span = f"{first.index}" if last == first.index else f"{first.index}-{last}"
    e = first.event or {}
    detail = first.note or ""
    if e:
        score = f", score {e['score']:.3g}" if isinstance(e.get("score"), int | float) else ""
        by = f" by {e['policy']}" if e.get("policy") else ""
        detail = f"{e.get('age_s', 0.0):.1f}s ago{by}{score}: {e.get('reason', '')}"
    cause = (first.cause or "").replace("_", " ")
    return span, first.outcome, first.tier or "", cause, first.block_hash.hex()[:16], detail


def _tier_rows(s) -> list[tuple]:
    return [
        (t.name, t.stored_blocks, t.capacity_blocks, t.used_slots, f"{100 * t.occupancy:.1f} %", t.hits,
         t.evictions)
        for t in s.tiers
    ]  # fmt: skip


def _decision_rows(report: Mapping[str, Any]) -> list[tuple]:
    rows = []
    for d in report["decisions"]:
        score = "" if d.score is None else f"{d.score:.4g}"
        rows.append((f"{d.age_s:.1f}s", d.action, d.block_hash.hex()[:16], d.policy or "", score, d.reason))
        if d.components:
            rows.append(("", "", "", "", "", "  " + _components(d.components)))
    return rows


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        text = "  ".join(c.ljust(w) if i == 0 or not _numeric(c) else c.rjust(w) for i, (c, w) in
                         enumerate(zip(row, widths, strict=True)))  # fmt: skip
        lines.append(text.rstrip())
    return lines


def _numeric(cell: str) -> bool:
    return cell.replace(".", "", 1).replace(",", "").replace(" %", "").lstrip("-").isdigit()


def _components(components: Mapping[str, float]) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in components.items())


def _by(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f} %"


def _ttft(t) -> str:
    return "n/a" if t is None else f"p50 {1000 * t.p50_s:.0f} ms, p90 {1000 * t.p90_s:.0f} ms (n={t.count})"


def _block_state(b) -> str:
    if b.evictable:
        return "evictable"
    flags = [f"{b.loads_in_flight} loads" if b.loads_in_flight else "", "moving" if b.moving else ""]
    flags.append("" if b.ready else "storing")
    return "pinned: " + (", ".join(f for f in flags if f) or "retired slot in use")


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if hasattr(value, "action"):
            out["action"] = value.action
        return out
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 1000:
        raise argparse.ArgumentTypeError(f"expected a count 0..1000, got {text[:40]}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds, more than 0 and at most 3600, got {text[:40]}")
    return value
