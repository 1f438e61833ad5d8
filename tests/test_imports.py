"""The package's import structure, read from the source with `ast` (nothing is imported):

- no cycles between jaxrubric's modules, counting every `import` / `from ... import` anywhere in
  a module (module level, inside functions, under `if TYPE_CHECKING:`);
- the layering: the generic host loop (`jaxrubric.train_loop`) knows no co-evolution method,
  and only the tools (`jaxrubric.plan*`, `jaxrubric.toy*`, `jaxrubric.cli`) import the tools;
- one registry reads `config.method` (`jaxrubric.methods.get_method`): nothing compares it.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from helpers import ROOT

PACKAGE = ROOT / "jaxrubric"
# The tools, as prefixes (`jaxrubric.plan*`, `jaxrubric.toy*`), and the command line.
TOOL_PREFIXES = ("jaxrubric.plan", "jaxrubric.toy")
CLI = "jaxrubric.cli"


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its `__init__.py`)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _base(name: str, level: int) -> str:
    """The package a relative import of `level` dots in module `name` starts from."""
    package = name if _is_package(name) else name.rpartition(".")[0]
    for _ in range(level - 1):
        package = package.rpartition(".")[0]
    return package


def imports(name: str, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, module) of every jaxrubric module that module `name` imports, anywhere in it.
    `from pkg import x` imports module `pkg.x` when there is one, else (a name defined in
    `pkg`) the package itself. Names that resolve to no module are yielded as they are (see
    `test_every_import_of_the_package_resolves`). `source`: read instead of the module's file."""
    if source is None:
        source = MODULES[name].read_text(encoding="utf-8")
    tree = ast.parse(source, filename=str(MODULES[name]))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "jaxrubric":
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _base(name, node.level)
                package = f"{package}.{node.module}" if node.module else package
            else:
                package = node.module or ""
            if package.split(".")[0] != "jaxrubric":
                continue
            for alias in node.names:
                child = f"{package}.{alias.name}"
                yield node.lineno, child if child in MODULES else package


def import_graph() -> dict[str, set[str]]:
    """Module -> the jaxrubric modules it imports (only those that exist)."""
    return {name: {m for _, m in imports(name) if m in MODULES and m != name}
            for name in MODULES}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a cycle
    through its modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_cycle_through(graph, set(c)) for c in components)


def _cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """One cycle inside a strongly connected component, from its first module back to it."""
    start = min(component)
    seen = {start}
    # Breadth-first from `start` back to `start` inside the component: the shortest cycle.
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    cycle = [start]
                    while v != start:
                        cycle.append(v)
                        v = parents[v]
                    return [start, *reversed(cycle[1:]), start]
                if w not in seen:
                    seen.add(w)
                    parents[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{sorted(component)} is not strongly connected")


def closure(graph: dict[str, set[str]], start: str, *, with_parents: bool = True
            ) -> dict[str, list[str]]:
    """Every module `start` imports, transitively, with the chain that reaches it. Importing
    `a.b.c` runs `a/__init__.py` and `a/b/__init__.py` first: with `with_parents` those count
    as imported too."""
    chains = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop()
        targets = set(graph[v])
        if with_parents:
            for w in list(targets) + [v]:
                parts = w.split(".")
                targets |= {".".join(parts[:i]) for i in range(1, len(parts))} & set(MODULES)
        for w in sorted(targets):
            if w not in chains:
                chains[w] = [*chains[v], w]
                todo.append(w)
    return chains


def _is(name: str, prefixes: tuple[str, ...]) -> bool:
    return name.startswith(prefixes)


# ------------------------------------------------------------------------------ the tests
WALKED = """
from __future__ import annotations
import json
import jaxrubric
import jaxrubric.models.transformer as t
from typing import TYPE_CHECKING
from jaxrubric import roles, ModelConfig
from . import dynamic_rubric
from .round_config import RoundConfig
from .. import sharding
if TYPE_CHECKING:
    from jaxrubric.flops import round_flops


def later():
    from jaxrubric.toy import ORACLES
    import jaxrubric.plan.cli
"""


def test_the_walk_sees_every_kind_of_import():
    """The reader itself (else the checks below would pass vacuously): plain and relative
    imports, `from pkg import module` and `from pkg import name`, imports inside functions and
    under TYPE_CHECKING all become edges, read as if in `jaxrubric.methods.genrubric`."""
    found = [module for _, module in imports("jaxrubric.methods.genrubric", WALKED)]
    assert sorted(found) == sorted([
        "jaxrubric", "jaxrubric.models.transformer", "jaxrubric.roles", "jaxrubric",
        "jaxrubric.methods.dynamic_rubric", "jaxrubric.methods.round_config", "jaxrubric.sharding",
        "jaxrubric.flops", "jaxrubric.toy", "jaxrubric.plan.cli"])
    assert _base("jaxrubric.methods", 1) == "jaxrubric.methods"  # a package's own level
    assert _base("jaxrubric.methods.data", 2) == "jaxrubric"
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}, "e": {"a"}}) == [
        ["a", "b", "c", "a"]]
    assert closure({"a": {"b"}, "b": {"c"}, "c": set()}, "a", with_parents=False) == {
        "a": ["a"], "b": ["a", "b"], "c": ["a", "b", "c"]}
    graph = import_graph()
    assert {"jaxrubric.methods", "jaxrubric.methods.data", "jaxrubric.train_loop",
            "jaxrubric.toy", "jaxrubric.cli"} <= set(graph)
    assert "jaxrubric.methods" in graph["jaxrubric.train"]  # training asks the registry
    assert sum(map(len, graph.values())) > 2 * len(graph)


def test_every_import_of_the_package_resolves():
    """An import of a jaxrubric module that is not there (a module moved or renamed)."""
    missing = [f"{MODULES[name].relative_to(ROOT)}:{line}: {module}"
               for name in MODULES for line, module in imports(name) if module not in MODULES]
    assert not missing, "imports of modules that do not exist:\n" + "\n".join(missing)


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_host_loop_imports_no_method():
    chains = closure(import_graph(), "jaxrubric.train_loop")
    methods = {m: chain for m, chain in chains.items() if _is(m, ("jaxrubric.methods",))}
    assert not methods, "jaxrubric.train_loop reaches a method:\n" + "\n".join(
        " -> ".join(chain) for chain in methods.values())


def test_the_host_loop_imports_no_method_at_run_time():
    """The same, as Python sees it: what importing the host loop loads."""
    code = ("import sys, jaxrubric.train_loop\n"
            "print('\\n'.join(m for m in sys.modules if m.startswith('jaxrubric.')))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                            text=True, check=True,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"}).stdout.split()
    assert "jaxrubric.train_loop" in loaded
    assert not [m for m in loaded if _is(m, ("jaxrubric.methods",))], loaded


def test_only_the_tools_import_the_tools():
    offenders = [f"{MODULES[name].relative_to(ROOT)}:{line}: {name} imports {module}"
                 for name in MODULES if not (_is(name, TOOL_PREFIXES) or name == CLI)
                 for line, module in imports(name) if _is(module, TOOL_PREFIXES)]
    assert not offenders, "modules outside the tools import a tool:\n" + "\n".join(offenders)


def test_nothing_compares_the_method_name():
    """`config.method` is read by the registry (`jaxrubric.methods.get_method`) alone: a
    method's behaviour lives in its `Method`, never behind `if method == ...`."""
    pattern = re.compile(r"method ==")
    hits = [f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
            for path in sorted(PACKAGE.rglob("*")) if path.is_file()
            and "__pycache__" not in path.parts
            for i, line in enumerate(_text_lines(path), 1) if pattern.search(line)]
    assert not hits, "comparisons of the method name:\n" + "\n".join(hits)


def _text_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []
