"""The project's import graph: no cycle (imports inside functions included) and no module
importing another module's private (underscore) names, in ``analyses/`` and ``pipelines/``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("analyses", "pipelines")


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def _resolve(importer: str, node: ast.ImportFrom, is_pkg: bool) -> str:
    if not node.level:
        return node.module or ""
    base = importer.split(".") if is_pkg else importer.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def import_edges(modules: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """importer -> imported project modules (every import statement, at any depth), and the
    private names imported across modules as ``importer: module._name``."""
    edges: dict[str, set[str]] = {m: set() for m in modules}
    private: list[str] = []
    for mod, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                src = _resolve(mod, node, path.name == "__init__.py")
                targets = []
                for a in node.names:
                    sub = f"{src}.{a.name}"
                    targets.append(sub if sub in modules else src)
                    if a.name.startswith("_") and sub not in modules and src != mod:
                        private.append(f"{mod}: {src}.{a.name}")
            else:
                continue
            edges[mod].update(t for t in targets if t in modules and t != mod)
    return edges, private


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_no_import_cycle() -> None:
    edges, _ = import_edges(project_modules())
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_private_name_imported_across_modules() -> None:
    _, private = import_edges(project_modules())
    assert private == []


def test_the_checker_finds_a_cycle_and_a_private_import(tmp_path: Path) -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "x.py").write_text("def f():\n    from p.y import _g\n")
    (pkg / "y.py").write_text("from p.x import f\n_g = 1\n")
    mods = {"p.x": pkg / "x.py", "p.y": pkg / "y.py"}
    edges, private = import_edges(mods)
    assert find_cycle(edges) == ["p.x", "p.y", "p.x"] and private == ["p.x: p.y._g"]
