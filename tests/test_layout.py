"""The architecture, checked statically: one sub-package per stage, nothing imports upward, no cycle.

kforge_record <- kforge_dash.contract (and its helpers) <- ingest <- findings <- ingest.run <- {export, browse}
<- pipeline (cluster) <- cli.
ingest/ is the row pass (plan, read, rows, options...); findings/, a stage beside it, analyses the row pass's
outputs; ingest/run.py (ingest_run) calls both, so it sits above findings. findings/thresholds.py, the
findings' options, is an ingest option (IngestOptions.findings), so it sits in the row pass's layer.
Every import counts, those under `if TYPE_CHECKING:` and inside functions included.
And in tests/: no test module imports another.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("kforge_record", "kforge_dash")
LAYERS = {  # module prefix -> layer; a module may import only from its own layer or below
    "kforge_record": 0,
    "kforge_dash.contract": 1, "kforge_dash.optional": 1, "kforge_dash.progress": 1,
    "kforge_dash.text": 1,  # numbers and counts as text, for every front end (and ingest's messages)
    "kforge_dash.column_registry": 1,  # each column and summary field: label, unit, format, help
    "kforge_dash.ingest": 2,  # the row pass and ingest's interface types
    "kforge_dash.run_view": 2,  # a run's summary.json as the front ends show it (ingest's materiality rule)
    "kforge_dash.importers": 2,  # other trackers' logs -> kforge shards: reads TensorBoard/W&B, writes as the recorder
    "kforge_dash.findings.thresholds": 2,  # FindingsOptions: an ingest option, dataclasses only
    "kforge_dash.findings": 3,  # findings read what the row pass wrote
    "kforge_dash.ingest.run": 4,  # ingest_run: the row pass, then the findings
    "kforge_dash.export": 5, "kforge_dash.browse": 5,
    "kforge_dash.pipeline": 6, "kforge_dash.cluster": 6,  # cluster: the pipeline on Dask
    "kforge_dash.cli": 7,
}
SIBLINGS = {"kforge_dash.export", "kforge_dash.browse"}  # same layer, but neither imports the other
HEAVY = ("polars", "streamlit", "wandb", "dask", "distributed", "tensorboard", "plotly")


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (resolved to the longest known module name)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` depends on pkg.mod; `from pkg import name` on pkg itself
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
            targets = subs + ([base] if len(subs) < len(node.names) else [])
        for t in targets:
            hits = [m for m in known if t == m or t.startswith(m + ".")]
            if hits:
                found.add(max(hits, key=len))
    found.discard(name)
    return found


def layer_of(name: str) -> tuple[int, str] | None:
    best = max((p for p in LAYERS if name == p or name.startswith(p + ".")), key=len, default=None)
    return (LAYERS[best], best) if best else None


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {n: imports(n, p, set(mods)) for n, p in mods.items()}


def test_stages_are_sub_packages():
    for pkg in ("ingest", "export", "browse", "cli"):
        assert (ROOT / "kforge_dash" / pkg / "__init__.py").is_file(), pkg


def test_nothing_imports_upward():
    bad = []
    for mod, deps in graph().items():
        here = layer_of(mod)
        if here is None:  # kforge_dash/__init__.py: lazy re-exports only
            continue
        for dep in deps:
            there = layer_of(dep)
            if there is None:
                continue
            if there[0] > here[0] or (here[1] in SIBLINGS and there[1] in SIBLINGS and here[1] != there[1]):
                bad.append(f"{mod} imports {dep}")
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycle():
    g = graph()
    index, low, on, stack, cycles, counter = {}, {}, set(), [], [], [0]

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_recorder_imports_nothing_heavy():
    for name, path in modules().items():
        if not name.startswith("kforge_record") or name.startswith("kforge_record.integrations"):
            continue  # integrations import their own framework, lazily
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not [n for n in names if n.split(".")[0] in HEAVY], f"{name} imports {names}"


def test_modules_stay_small():
    big = [f"{n}: {len(p.read_text().splitlines())} lines" for n, p in modules().items()
           if len(p.read_text().splitlines()) > 400]
    assert not big, big


def test_no_test_module_imports_another():
    """Helpers shared by test modules live in *_fixtures.py (fixtures in conftest.py), never in a test module."""
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.name} imports {n}" for n in names if n.split(".")[0].startswith("test_")]
    assert not found, found


def _module_map_gaps(pkg: Path) -> list[str]:
    """What ``pkg/__init__.py``'s docstring (its module map) leaves out or names in vain: each module as
    ``name.py``, each sub-folder holding modules as ``name/``; a bare ``name.py`` it names must be in the folder."""
    doc = ast.get_docstring(ast.parse((pkg / "__init__.py").read_text())) or ""
    here = {p.name for p in pkg.glob("*.py") if p.name != "__init__.py"}
    folders = {p.name for p in pkg.iterdir() if p.is_dir() and p.name != "__pycache__" and any(p.rglob("*.py"))}
    rel = pkg.relative_to(ROOT)
    gaps = [f"{rel}/{m} is not in its module map" for m in sorted(here)
            if not re.search(rf"(?<![\w/.-]){re.escape(m)}\b", doc)]
    gaps += [f"{rel}/{d}/ is not in its module map" for d in sorted(folders)
             if not re.search(rf"(?<![\w/.-]){re.escape(d)}/", doc)]
    named = set(re.findall(r"(?<![\w/.-])(\w+\.py)\b", doc))
    gaps += [f"{rel}/__init__.py names {m}, which is not in the folder" for m in sorted(named - here)]
    return gaps


def test_every_module_map_lists_every_module():
    """Each package's ``__init__.py`` docstring maps its folder: every module and sub-folder, none that is gone."""
    packages = sorted(p.parent for pkg in PACKAGES for p in (ROOT / pkg).rglob("__init__.py"))
    assert len(packages) >= 8, packages
    gaps = [g for pkg in packages for g in _module_map_gaps(pkg)]
    assert not gaps, "\n".join(gaps)
