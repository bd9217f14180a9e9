"""The layout's rules, checked on the source: no import cycles between the product's modules, and no
module importing another package's private names. A cycle means two rooms that cannot change
apart (and imports that only work in one order); a private name used from elsewhere is a door
that was never meant to be one. Imports under `if TYPE_CHECKING:` are annotations, not
dependencies, and are left out."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = {"txbroker": REPO / "broker_image" / "txbroker", "txbroker_operator": REPO / "operator" / "txbroker_operator",
            "txbroker_spark": REPO / "spark" / "txbroker_spark"}


def _modules() -> dict[str, Path]:
    mods = {}
    for root in PACKAGES.values():
        for f in root.rglob("*.py"):
            parts = list(f.relative_to(root.parent).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            mods[".".join(parts)] = f
    return mods


MODULES = _modules()


def _package(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _imports(module: str) -> list[tuple[str, str | None]]:
    """(imported module, imported name or None) for each import that runs."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = _package(module).split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub, None) if sub in MODULES else (target, a.name))
    return [(m, name) for m, name in out if m in MODULES and m != module]


GRAPH = {m: _imports(m) for m in MODULES}


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w, _ in GRAPH[v]:
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
                found.append(sorted(component))

    for m in MODULES:
        if m not in index:
            visit(m)
    return found


def test_the_checks_see_the_product():
    assert len(MODULES) > 100 and "txbroker.broker.server" in MODULES and "txbroker_spark.options" in MODULES
    assert ("txbroker.protocol.names", None) in GRAPH["txbroker.broker.topics"] \
        or ("txbroker.protocol.names", "TOPIC_NAME") in GRAPH["txbroker.broker.topics"]


def test_no_import_cycles():
    assert _cycles() == []


def test_no_module_imports_a_private_name_from_another_package():
    private = [f"{m} imports {name} from {target}" for m, imports in GRAPH.items() for target, name in imports
               if name and name.startswith("_") and not name.startswith("__") and _package(target) != _package(m)]
    assert private == []


# The store's one door (store/state.py): outside the store package, state changes through append
# and is read through StateMachine's methods, never through its RocksDB handles, its group-commit
# writer or its pending map.
STORE_INSIDES = {"db", "writer", "_writer", "pending", "_pending"}


def test_nothing_outside_the_store_reaches_into_its_insides():
    store = PACKAGES["txbroker"] / "store"
    reached = []
    for module, path in MODULES.items():
        if path.is_relative_to(store):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in STORE_INSIDES and \
                    isinstance(node.value, (ast.Attribute, ast.Name)) and \
                    (node.value.attr if isinstance(node.value, ast.Attribute) else node.value.id) in ("state", "_state"):
                reached.append(f"{module}:{node.lineno} {ast.unparse(node)}")
    assert reached == []
