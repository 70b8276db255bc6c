"""The import graph of the source folders: no cycles, and a module's folder says which process runs it and
what it may import (README, "Architecture"). Read from the files with ast, imports inside functions too."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"tiercache": "tiercache", "kernels": "tiercache.kernels", "graph": "tiercache.graph",
           "connectors": "tiercache.connectors"}  # fmt: skip

# Each module belongs to the first group whose prefix names it; a group may import only the groups listed.
GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("kernels", ("tiercache.kernels",)),
    ("scheduler", ("tiercache.scheduler", "tiercache.graph")),
    ("worker", ("tiercache.worker",)),
    ("inspect", ("tiercache.inspect",)),
    ("cli", ("tiercache.cli",)),
    ("scheduler glue", ("tiercache.connectors.scheduler",)),
    ("worker glue", ("tiercache.connectors.worker", "tiercache.connectors.attention")),
    ("boundary", ("tiercache.connectors.vllm", "tiercache.connectors.metrics")),
    ("shared", ("tiercache.connectors", "tiercache")),  # the rest: wire, config, layout, codecs, plugin, …
]
MAY_IMPORT = {
    "kernels": {"kernels"},
    "shared": {"shared", "kernels"},
    "scheduler": {"shared", "scheduler"},
    "worker": {"shared", "kernels", "worker"},
    "inspect": {"shared", "scheduler", "inspect"},
    "scheduler glue": {"shared", "scheduler", "inspect", "scheduler glue"},
    "worker glue": {"shared", "kernels", "worker", "worker glue"},
    "boundary": {"shared", "scheduler glue", "worker glue", "boundary"},
    "cli": {"shared", "kernels", "scheduler", "worker", "inspect", "cli"},
}
SIDES = {"scheduler": {"scheduler", "scheduler glue"}, "worker": {"worker", "worker glue"}}


def modules() -> dict[str, Path]:
    out = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def group_of(module: str) -> str:
    for name, prefixes in GROUPS:
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return name
    raise AssertionError(f"{module} is in no group")


def import_graph(mods: dict[str, Path]) -> nx.DiGraph:
    graph = nx.DiGraph()
    graph.add_nodes_from(mods)
    for module, path in mods.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, mods):
                if target != module:
                    graph.add_edge(module, target)
    return graph


def _targets(node: ast.AST, package: str, mods: dict[str, Path]) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in mods]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*anchor, base] if base else anchor)
    found = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
    return found or ([base] if base in mods else [])


def violations(graph: nx.DiGraph) -> list[str]:
    out = [" → ".join([*cycle, cycle[0]]) for cycle in nx.simple_cycles(graph)]
    for a, b in graph.edges:
        ga, gb = group_of(a), group_of(b)
        if gb not in MAY_IMPORT[ga]:
            out.append(f"{a} ({ga}) imports {b} ({gb})")
    return out


def test_every_module_is_in_a_group_and_the_graph_has_no_violation():
    graph = import_graph(modules())
    assert len(graph) > 60 and graph.number_of_edges() > 100  # the walk found the tree
    assert violations(graph) == []


def test_the_two_sides_share_only_the_shared_modules():
    for side, groups in SIDES.items():
        other = SIDES["worker" if side == "scheduler" else "scheduler"]
        assert not any(g in MAY_IMPORT[own] for own in groups for g in other), side


@pytest.mark.parametrize(
    ("edge", "expected"),
    [
        (("tiercache.worker.tier_worker", "tiercache.scheduler.manager"), "(worker) imports"),
        (("tiercache.scheduler.manager", "tiercache.worker.pools"), "(scheduler) imports"),
        (("tiercache.wire", "tiercache.scheduler.moves"), "(shared) imports"),
        (("tiercache.scheduler.moves", "tiercache.scheduler.manager"), " → "),  # a cycle
    ],
)
def test_the_checker_finds_a_bad_edge_or_a_cycle(edge, expected):
    graph = import_graph(modules())
    graph.add_edge(*edge)
    assert any(expected in v for v in violations(graph)), violations(graph)
