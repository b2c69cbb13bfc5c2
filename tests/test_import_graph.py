"""No import cycles in the package: module-level imports between torch_uqr's modules form a DAG
(imports inside functions are deliberate late binding and are not counted; nor is a module's
import of its own parent packages, which Python runs first anyway)."""
from __future__ import annotations

import ast
import os

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "torch_uqr")


def _modules() -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), os.path.dirname(PKG))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = os.path.join(dirpath, f)
    return out


def _top_level_imports(tree: ast.Module):
    """Import nodes outside function and class bodies (if / try blocks at module level count)."""
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, str]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, path in modules.items():
        is_pkg = path.endswith("__init__.py")
        package = mod if is_pkg else mod.rpartition(".")[0]
        edges: set[str] = set()
        for node in _top_level_imports(ast.parse(open(path).read())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = package.split(".")
                if node.level:
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                targets = [f"{target}.{a.name}" if f"{target}.{a.name}" in modules else target for a in node.names]
            for t in targets:
                while t and t not in modules:  # `import a.b.c` names a module or an attribute of one
                    t = t.rpartition(".")[0]
                if t and t != mod and not mod.startswith(t + "."):
                    edges.add(t)
        graph[mod] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (c := visit(n)):
                return c
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (c := visit(m)):
            return c
    return None


def test_package_has_no_import_cycle() -> None:
    graph = import_graph(_modules())
    assert "torch_uqr.ops" in graph and graph["torch_uqr.ops"], "the graph missed the package's imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_planted_cycle_is_found() -> None:
    graph = import_graph(_modules())
    graph["torch_uqr.formats.table"] = graph["torch_uqr.formats.table"] | {"torch_uqr.ops"}
    assert find_cycle(graph) is not None
