"""The package's layers point one way: a module imports only from its own layer or below, lazily
(inside a function) or not. The layers, bottom up, are the ones docs/ARCHITECTURE.md describes."""

from __future__ import annotations

import ast
from pathlib import Path

import collapseguard

PACKAGE = Path(collapseguard.__file__).parent

#: bottom up; a name is a top-level module or subpackage of collapseguard
LAYERS = [
    {"errors", "images", "io"},                        # files in, arrays and bytes out
    {"detectors"},                                     # images in, floats out
    {"scoring", "engines"},                            # the one scoring loop, and who runs it
    {"training_data_tools"},                           # chains: sources, replicators, manifests
    {"filter", "dedup", "audit", "calibration", "evaluation", "training", "inline", "demo"},  # features
    {"commands", "cli", "__main__"},                   # the face
]


def layer_of(part: str) -> int:
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"collapseguard.{part} is in no layer: add it to LAYERS (and the docs)")


def imported_parts(tree: ast.AST, module_parts: list[str]) -> list[tuple[str, int]]:
    """(top-level collapseguard part, line) of every collapseguard import in a module."""
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module_parts[: len(module_parts) - node.level]
                names = [".".join(["collapseguard", *base, *(node.module or "").split(".")])]
            elif node.module:
                names = [node.module]
                if node.module == "collapseguard":
                    names = [f"collapseguard.{a.name}" for a in node.names]
        for n in names:
            parts = n.split(".")
            if parts[0] == "collapseguard" and len(parts) > 1 and parts[1]:
                found.append((parts[1], node.lineno))
    return found


def test_every_import_points_down_or_sideways():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        if parts == ["__init__"]:
            continue  # the package's own face re-exports what users import
        own = layer_of(parts[0])
        for target, line in imported_parts(ast.parse(path.read_text()), parts[:-1] if
                                           parts[-1] == "__init__" else parts[:-1]):
            if layer_of(target) > own:
                wrong.append(f"{rel}.py:{line} imports collapseguard.{target} "
                             f"(layer {layer_of(target)} above its own {own})")
    assert not wrong, "\n".join(wrong)


def sideways_graph() -> dict[str, set[str]]:
    """Which top-level parts of one layer each part imports (lazily or not)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        parts = list(rel.parts)
        if parts == ["__init__"]:
            continue
        for target, _ in imported_parts(ast.parse(path.read_text()), parts[:-1]):
            if target != parts[0] and layer_of(target) == layer_of(parts[0]):
                graph.setdefault(parts[0], set()).add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle, each as the path that closes it (depth-first)."""
    found, done = [], set()

    def walk(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                found.append(path[path.index(nxt):] + [nxt])
            elif nxt not in done:
                walk(nxt, path + [nxt])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            walk(start, [start])
    return found


def test_sideways_imports_form_no_cycle():
    """Within a layer imports may go sideways, but one way: two features that import each other
    are one feature, or share something that belongs a layer down."""
    assert not cycles(sideways_graph()), cycles(sideways_graph())


def test_the_cycle_check_finds_a_cycle():
    assert cycles({"audit": {"dedup"}, "dedup": {"audit"}}) == [["audit", "dedup", "audit"]]
    assert cycles({"audit": {"dedup"}, "dedup": {"filter"}}) == []


def test_the_walk_sees_lazy_and_upward_imports():
    tree = ast.parse("def f():\n    from collapseguard.commands import x\n")
    assert imported_parts(tree, ["io"]) == [("commands", 2)]
    assert layer_of("commands") > layer_of("io")
