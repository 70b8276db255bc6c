"""`tiercache inspect`: the readable tables, --json, --explain, and the message when nothing answers."""

from __future__ import annotations

import json

from tiercache.cli import main
from tiercache.config import InspectConfig
from tiercache.inspect import InspectionService
from tiercache.inspect import paths as inspect_paths


def test_tables(served, capsys):
    _, service = served
    assert main(["inspect", "--socket", str(service.path), "--decisions", "5", "--blocks", "3"]) == 0
    out = capsys.readouterr().out
    assert f"tiercache @ {service.path}" in out and "policy lru" in out
    header = next(line for line in out.splitlines() if line.startswith("TIER"))
    assert header.split() == ["TIER", "STORED", "CAPACITY", "USED", "OCCUPANCY", "HITS", "EVICTED"]
    assert any(line.startswith("vram ") for line in out.splitlines())
    assert "hit rate" in out and "latest decisions (newest first, 5)" in out
    assert "least recently used" in out and "idle_s=" in out
    assert "most recently used blocks" in out


def test_graph_components_in_the_table(graph_run, short_dir, capsys):
    with InspectionService(graph_run.state, short_dir / "g.sock") as service:
        assert main(["inspect", "--socket", str(service.path), "--decisions", "50"]) == 0
    out = capsys.readouterr().out
    assert "policy graph" in out and "lowest priority leaf" in out
    assert "tick=" in out and "horizon=" in out and "total=" in out


def test_json(served, capsys):
    _, service = served
    assert (
        main(["inspect", "--socket", str(service.path), "--json", "--decisions", "3", "--blocks", "2"]) == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["where"] == str(service.path)
    assert report["stats"]["evictions"] > 0 and len(report["stats"]["tiers"]) == 2
    assert len(report["decisions"]) == 3 and len(report["blocks"]) == 2
    decision = report["decisions"][0]
    bytes.fromhex(decision["block_hash"])
    assert decision["action"] and decision["reason"] and "idle_s" in decision["components"]


def test_explain(served, capsys):
    run, service = served
    stored = run.manager.view().hashes()[0].hex()
    assert main(["inspect", "--socket", str(service.path), "--decisions", "0", "--explain", stored[:16]]) == 0
    out = capsys.readouterr().out
    assert f"explain {stored}" in out and "LRU: idle" in out and "latest decisions" not in out


def test_no_service_says_what_to_do(short_dir, monkeypatch, capsys):
    monkeypatch.setattr(inspect_paths, "socket_dirs", lambda: [short_dir / "none"])
    monkeypatch.setattr("tiercache.inspect.client.live_states", lambda: [])
    monkeypatch.delenv(inspect_paths.SOCKET_ENV, raising=False)
    assert main(["inspect"]) == 1
    err = capsys.readouterr().err
    assert "no tiercache inspection socket found" in err and "--socket PATH" in err
    assert main(["inspect", "--socket", str(short_dir / "missing.sock")]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_list(lru_run, short_dir, monkeypatch, capsys):
    monkeypatch.setattr(inspect_paths, "socket_dirs", lambda: [short_dir / "tiercache"])
    inspect_paths.private_dir(short_dir / "tiercache")
    assert main(["inspect", "--list"]) == 1
    assert "no live inspection sockets" in capsys.readouterr().err
    with InspectionService.start(InspectConfig(socket="auto"), lru_run.state) as service:
        assert main(["inspect", "--list"]) == 0
        out = capsys.readouterr().out
        assert str(service.path) in out and "lru" in out
        assert main(["inspect", "--list", "--json"]) == 0
        (row,) = json.loads(capsys.readouterr().out)
        assert row["socket"] == str(service.path) and row["evictions"] > 0


def test_graph_summary_names_every_score_term():
    from tiercache.inspect.explain import summary

    comp = {"total": 1234.5, "tick": 1000, "horizon": 100, "reuse": -1.5, "hits": 0.0, "requests": 0.5,
            "source": 0.0, "importance": 0.0, "protection": 4.0}  # fmt: skip
    text = summary({"block": None, "components": comp, "policy": "graph", "decisions": []})
    assert "reuse -1.50 + hits 0.00 + requests 0.50 + source 0.00 + importance 0.00 + protection 4.00" in text
