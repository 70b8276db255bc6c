"""examples/grafana/tiercache.json plots only series tiercache exports, with their labels, and all of them
(names and labels from connectors/metrics.py; the real /metrics scrape: test_e2e_serve_metrics)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tiercache.connectors.metrics import _EXTRA_LABELS, _GAUGES, METRICS

DASHBOARD = Path(__file__).resolve().parents[2] / "examples" / "grafana" / "tiercache.json"
ENGINE_LABELS = {"model_name", "engine"}  # vLLM's per-engine labels on every series
SERIES = re.compile(r"vllm:tiercache_([a-z_]+)")


def dashboard_families() -> set[str]:
    """The metric family of every series the dashboard's queries name (a counter's family without _total)."""
    text = json.dumps(_queries(json.loads(DASHBOARD.read_text())))
    return {"vllm:tiercache_" + name.removesuffix("_total") for name in SERIES.findall(text)}


def _queries(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    return exprs + [v["definition"] for v in dashboard["templating"]["list"]]


def test_every_series_exists_with_its_kind_and_labels():
    dashboard = json.loads(DASHBOARD.read_text())
    for expr in _queries(dashboard):
        for name in SERIES.findall(expr):
            base = name.removesuffix("_total")
            assert base in METRICS, f"{expr}: tiercache exports no {base}"
            if base in _GAUGES:
                assert not name.endswith("_total"), f"{expr}: {base} is a gauge"
            else:
                assert name.endswith("_total") and f"rate(vllm:tiercache_{name}" in expr, (
                    f"{expr}: {base} is a counter: plot rate(…_total)"
                )
            for group in re.findall(r"by \(([^)]*)\)", expr):
                labels = {label.strip() for label in group.split(",")}
                assert labels <= ENGINE_LABELS | set(_EXTRA_LABELS.get(base, ())), (expr, labels)


def test_every_exported_series_is_plotted():
    assert dashboard_families() == {"vllm:tiercache_" + name for name in METRICS}
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({p["id"] for p in panels}) == len(panels) and all(p["targets"] for p in panels)
