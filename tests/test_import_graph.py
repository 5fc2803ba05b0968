"""The shape of the code as its imports draw it: no module of analyzer/, spark_jobs/ or dashboards/
reaches itself through imports (a circle makes a module's meaning depend on import order, and
hides which layer owns what), and the dashboards, which only describe what the analysis writes,
import nothing from spark_jobs/.

Every import counts, a function's as much as the module's: one run of the program still walks it.
"""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("analyzer", "spark_jobs", "dashboards")


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}


def _extensions() -> set[str]:
    """The C twins (`from . import _plain`): modules too, with no imports of their own here."""
    return {_name(path) for package in PACKAGES for path in (ROOT / package).rglob("*.c")}


def _imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that `name` imports: `from package import module` names the module,
    `from module import function` the module (its package's __init__ runs first, but a package is
    its own node only where it is imported as such)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                inner = f"{module}.{alias.name}"
                targets.add(inner if inner in known else module)
    found = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            found.add(target)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules) | _extensions()
    return {name: _imported(name, path, known) & set(modules) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph[target]))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _edges_within(graph, component):
    members = set(component)
    return [f"{a} -> {b}" for a in component for b in sorted(graph[a] & members)]


def test_no_module_imports_itself_through_others():
    graph = import_graph()
    assert len(graph) > 100 and graph["spark_jobs.session"], "the walk found the project's modules"
    found = circles(graph)
    assert found == [], "\n\n".join("\n".join(_edges_within(graph, c)) for c in found)


def test_the_dashboards_import_nothing_from_the_analysis_job():
    graph = import_graph()
    offending = sorted(f"{a} -> {b}" for a, targets in graph.items() if a.startswith("dashboards")
                       for b in targets if b.startswith("spark_jobs"))
    assert offending == []


def test_the_walk_sees_circles_through_functions_and_packages():
    """The checker itself, on a circle as the spark-submit entry made it (a function's import of
    the command that imports the job back) and on a clean chain."""
    assert circles({"analyzer.cli": {"spark_jobs.analyze"}, "spark_jobs.analyze": {"analyzer.cli"}}) == \
        [["analyzer.cli", "spark_jobs.analyze"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    known = set(_modules()) | _extensions()
    assert _imported("spark_jobs.job", ROOT / "spark_jobs" / "job.py", known) == {"analyzer.cli"}
    # `from . import _plain` is the C twin, not the package analyzer.timeline (which imports plain.py).
    plain = _imported("analyzer.timeline.plain", ROOT / "analyzer" / "timeline" / "plain.py", known)
    assert "analyzer.timeline._plain" in plain and "analyzer.timeline" not in plain
