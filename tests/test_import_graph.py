"""hvdtrain's modules import one another without a cycle (fast tier: reads the source, imports
nothing).

    pytest tests/test_import_graph.py

The graph is built with `ast` from every `import hvdtrain...` and `from hvdtrain... import ...`
in hvdtrain/, wherever it stands: at the top of a module or inside a function (a lazy import
still makes the two modules depend on each other; it only hides the cycle until that function
runs). `from hvdtrain.pkg import name` depends on the module hvdtrain.pkg.name where there is
one, else on the package hvdtrain.pkg. Importing a submodule also runs its packages' __init__,
but ours import nothing of their own at import time (hvdtrain/torch/__init__.py's `fit` is
loaded on first use, and that lazy import is an edge like any other) except
hvdtrain/checkpoint/__init__.py, which gathers its own submodules' names (edges like any other;
none of them imports the package back), so no edge is added for it.
"""
from __future__ import annotations

import ast
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "hvdtrain"


def module_files(root: str = REPO) -> dict[str, str]:
    """{module name: path} for every .py file under hvdtrain/ (a package is its __init__)."""
    modules = {}
    for directory, _, files in os.walk(os.path.join(root, PACKAGE)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                parts = os.path.relpath(path, root)[:-3].split(os.sep)
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                modules[".".join(parts)] = path
    return modules


def imported_modules(path: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The hvdtrain modules that `module` (at `path`) imports anywhere in its source."""
    found = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's own package, up level-1
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known else base)
    # `import hvdtrain.a.b` names the module itself; keep only ours, never the module itself.
    return {name for name in found if name in known and name != module}


def import_graph(root: str = REPO) -> dict[str, set[str]]:
    files = module_files(root)
    known = set(files)
    return {module: imported_modules(path, module, path.endswith("__init__.py"), known)
            for module, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), each as a
    path that starts and ends at its alphabetically first module, e.g. [a, b, a]."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules (~70)
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(_cycle_through(graph, component) for component in components)


def _cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle from the component's first module back to itself (breadth first)."""
    start = min(component)
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return path[::-1] + [start]
                if nxt not in parents:
                    parents[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def test_hvdtrain_has_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles in hvdtrain (break each: move what both need into a module both import):\n" \
        + "\n".join("  " + " -> ".join(cycle) for cycle in found)


# The architecture, as what each part may import. A part is a package under hvdtrain/ or a
# top-level module. The input pipeline's and the cluster's packages stand below the trainer and
# know nothing of it; checkpoints know the options only; the trainer core (the top-level modules)
# knows no framework and no tool; a framework knows no other (Lightning's strategy builds on
# torch's) and no tool; the tools (the comparison, the doctor, the sbatch generator) may use all.
FRAMEWORKS = {"torch", "tf", "lightning"}
TOOLS = {"compare", "doctor", "predict", "slurm"}
MAY_IMPORT_ONLY = {
    "data": {"errors", "report", "cluster"},
    "cluster": {"errors", "report", "watchdog"},
    "checkpoint": {"config", "errors", "options", "report", "test_hooks", "watchdog"},
}
NEVER = {"torch": {"tf", "lightning"} | TOOLS, "tf": {"torch", "lightning"} | TOOLS, "lightning": {"tf"} | TOOLS}


def part(module: str) -> str:
    return module.split(".")[1] if "." in module else module


def disallowed_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in graph.items():
        mine = part(module)
        for other in sorted({part(m) for m in imported} - {mine, PACKAGE}):
            core = mine not in FRAMEWORKS | TOOLS | set(MAY_IMPORT_ONLY)
            if (mine in MAY_IMPORT_ONLY and other not in MAY_IMPORT_ONLY[mine]) or other in NEVER.get(mine, ()) \
                    or (core and other in FRAMEWORKS | TOOLS):
                found.append(f"{module} imports hvdtrain.{other}")
    return found


def test_each_part_imports_only_what_the_architecture_allows():
    found = disallowed_imports(import_graph())
    assert not found, "imports against the layering (tests/test_import_graph.py's MAY_IMPORT_ONLY, NEVER):\n" \
        + "\n".join("  " + line for line in found)


def test_the_layering_check_finds_an_upward_import():
    graph = {"hvdtrain.data.shards": {"hvdtrain.trainer"}, "hvdtrain.trainer": {"hvdtrain.torch.train"},
             "hvdtrain.torch.loop": {"hvdtrain.tf.data", "hvdtrain.data.augment"},
             "hvdtrain.lightning.data": {"hvdtrain.torch.loader"}, "hvdtrain.tf.train": {"hvdtrain.doctor.cli"}}
    assert disallowed_imports(graph) == ["hvdtrain.data.shards imports hvdtrain.trainer",
                                         "hvdtrain.trainer imports hvdtrain.torch",
                                         "hvdtrain.torch.loop imports hvdtrain.tf",
                                         "hvdtrain.tf.train imports hvdtrain.doctor"]


def test_the_graph_sees_lazy_and_relative_imports_and_finds_a_cycle(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from hvdtrain.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def late():\n    from .. import c\n")
    (pkg / "c.py").write_text("import os\nimport hvdtrain.a\n")
    (pkg / "d.py").write_text("from hvdtrain.a import something\n")
    graph = import_graph(str(tmp_path))
    assert graph["hvdtrain.a"] == {"hvdtrain.sub.b"}
    assert graph["hvdtrain.sub.b"] == {"hvdtrain.c"}
    assert graph["hvdtrain.d"] == {"hvdtrain.a"}
    assert cycles(graph) == [["hvdtrain.a", "hvdtrain.sub.b", "hvdtrain.c", "hvdtrain.a"]]


def test_the_error_lines_rank_is_cluster_envs():
    """errors.rank_label reads the launcher's variables itself (cluster/env.py imports errors):
    under every launcher it names the rank and size ClusterEnv finds."""
    from hvdtrain.cluster.env import ClusterEnv
    from hvdtrain.errors import rank_label

    slurm = {"SLURM_PROCID": "3", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "4",
             "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_NODES": "2",
             "SLURM_NODEID": "1"}
    environments = [
        {},
        {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", **slurm},  # mpirun in an allocation
        {"HOROVOD_RANK": "2", "HOROVOD_SIZE": "5", "RANK": "0", "WORLD_SIZE": "1"},
        slurm,
        {**slurm, "SLURM_STEP_NUM_TASKS": ""},
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "RANK": "1", "WORLD_SIZE": "3"},  # salloc shell
        {"RANK": "1", "WORLD_SIZE": "3"},
    ]
    for environ in environments:
        env = ClusterEnv.from_environ(environ)
        assert rank_label(environ) == f"rank {env.rank}/{env.world_size}", environ


def test_the_readmes_own_loop_call_works_after_importing_hvdtrain_torch():
    """README.md: `import hvdtrain.torch`, then `hvdtrain.torch.loop.start(...)` (an AttributeError
    while the package loaded only `fit` on first use)."""
    import subprocess
    import sys

    code = "import hvdtrain.torch; print(callable(hvdtrain.torch.loop.start), callable(hvdtrain.torch.fit))"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["True", "True"], done.stderr[-2000:]


def _defined_names(path: str) -> set[str]:
    """What a module defines or imports at its top level (also under if/try), read with ast."""
    names = set()
    for node in ast.parse(open(path).read(), path).body:
        for sub in ast.walk(node) if isinstance(node, (ast.If, ast.Try)) else [node]:
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in sub.names)
            elif isinstance(sub, (ast.Assign, ast.AnnAssign)):
                for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def test_every_name_imported_from_hvdtrain_is_there():
    """`from hvdtrain.x import name` anywhere (the package, tests, benchmarks, scripts, examples;
    lazy imports too) and `python -m hvdtrain.x` in the code, scripts and docs name a module or a
    name that exists: a module moved or split leaves no import that fails only when a job reaches it."""
    import re

    files = module_files()
    missing = []
    for top in ("hvdtrain", "tests", "benchmarks", "scripts", "torch_examples", "tf_examples"):
        for directory, _, names in os.walk(os.path.join(REPO, top)):
            for name in (n for n in names if n.endswith(".py")):
                path = os.path.join(directory, name)
                for node in ast.walk(ast.parse(open(path).read(), path)):
                    if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith(PACKAGE):
                        if node.module not in files:
                            missing.append(f"{path}:{node.lineno}: no module {node.module}")
                            continue
                        defined = _defined_names(files[node.module])
                        missing += [f"{path}:{node.lineno}: {node.module} has no {a.name}" for a in node.names
                                    if a.name not in defined and f"{node.module}.{a.name}" not in files]
    for top in ("hvdtrain", "scripts", "slurm", "docs", "README.md", "torch_examples", "tf_examples"):
        paths = [os.path.join(REPO, top)] if top.endswith(".md") else \
            [os.path.join(d, n) for d, _, ns in os.walk(os.path.join(REPO, top)) for n in ns
             if n.endswith((".py", ".sh", ".md", ".sbatch"))]
        for path in paths:
            for module in set(re.findall(r"-m (hvdtrain(?:\.\w+)+)", open(path, errors="replace").read())):
                if module not in files:
                    missing.append(f"{path}: python -m {module}: no such module")
                elif files[module].endswith("__init__.py") and f"{module}.__main__" not in files:
                    missing.append(f"{path}: python -m {module}: a package without __main__")
    assert not missing, "\n".join(missing)
