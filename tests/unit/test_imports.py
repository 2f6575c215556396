"""The package's layering, read from the source: no import cycle among our modules, Horovod
imported by one module, spark_jobs built on hvd_ctsm and never the other way below the top.

Every import counts, those inside function bodies and under `if __name__ == "__main__":` too
(a lazy import is still a dependency; a module's program block is part of the module). A
program that must import upward lives in a `__main__.py` of its own, which counts as top layer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("hvd_ctsm", "spark_jobs")
TOP_LAYER = {"hvd_ctsm.api", "hvd_ctsm.cli"}  # may import anything; nothing imports them
HOROVOD_HOME = "hvd_ctsm.distributed"  # the module (or package) that alone imports horovod
MLFLOW_HOME = "hvd_ctsm.tracking"  # the package that alone imports mlflow


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def our_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))}


def imported_names(tree: ast.AST) -> set[str]:
    """Dotted names imported anywhere in `tree`; `from a import b` gives `a.b` (b may be a
    module) besides `a`."""
    names: set[str] = set()
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        names |= imported_names(node)
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> our modules it imports (`from hvd_ctsm import distributed`: the package and
    hvd_ctsm.distributed; `from hvd_ctsm.config import load_config`: hvd_ctsm.config)."""
    modules = our_modules()
    return {name: {m for m in imported_names(ast.parse(path.read_text(), str(path)))
                   if m in modules} - {name}
            for name, path in modules.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (depth-first search, three colours)."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_and_reads_function_body_imports():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    tree = ast.parse("def f():\n    from hvd_ctsm.serving.score import x\n"
                     "if __name__ == '__main__':\n    import hvd_ctsm.api\n")
    assert {"hvd_ctsm.serving.score", "hvd_ctsm.api"} <= imported_names(tree)


def test_no_import_cycle_among_our_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_horovod_is_imported_only_by_the_distribution_module():
    offenders = []
    for folder in ("hvd_ctsm", "spark_jobs", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            name = module_name(path)
            if name == HOROVOD_HOME or name.startswith(HOROVOD_HOME + "."):
                continue
            tree = ast.parse(path.read_text(), str(path))
            if any(n == "horovod" or n.startswith("horovod.") for n in imported_names(tree)):
                offenders.append(name)
    assert offenders == [], f"import horovod only in {HOROVOD_HOME}, not in {offenders}"


def test_mlflow_is_imported_only_by_the_tracking_package_and_lazily():
    """hvd_ctsm.tracking alone imports mlflow, and its facade only inside functions: the
    package works without mlflow installed."""
    offenders = []
    for folder in ("hvd_ctsm", "spark_jobs", "benchmarks"):
        for path in sorted((REPO / folder).rglob("*.py")):
            name = module_name(path)
            tree = ast.parse(path.read_text(), str(path))
            mlflow_names = {n for n in imported_names(tree) if n.split(".")[0] == "mlflow"}
            if mlflow_names and not (name == MLFLOW_HOME or name.startswith(MLFLOW_HOME + ".")):
                offenders.append(name)
    assert offenders == [], f"import mlflow only in {MLFLOW_HOME}, not in {offenders}"
    facade = ast.parse((REPO / "hvd_ctsm" / "tracking" / "__init__.py").read_text())
    top_level = {alias.name for node in facade.body if isinstance(node, ast.Import)
                 for alias in node.names}
    top_level |= {node.module for node in facade.body if isinstance(node, ast.ImportFrom)}
    assert not {n for n in top_level if n and n.split(".")[0] == "mlflow"}
    assert not {n for n in top_level if n and n.startswith(MLFLOW_HOME + ".")} - {
        MLFLOW_HOME + ".link"}


def test_lower_layers_never_import_upward():
    """spark_jobs builds on hvd_ctsm; in hvd_ctsm only the top layer (the notebook API and the
    CLI) reaches into spark_jobs, and no module imports the top layer."""
    graph = import_graph()
    top = TOP_LAYER | {name for name in graph if name.endswith(".__main__")}  # programs
    upward = sorted(f"{name} -> {target}" for name, targets in graph.items()
                    for target in targets
                    if (target in TOP_LAYER and name not in top)
                    or (name.startswith("hvd_ctsm") and name not in top
                        and target.startswith("spark_jobs")))
    assert upward == []


# hvd_ctsm's subsystem folders (and its few top-level modules), bottom first, as README's code
# tour lists them. A module may import its own folder and the layers below; each folder's
# __init__.py says the same in words.
LAYERS = [
    {"hvd_ctsm", "errors", "progress", "config", "presets", "files"},  # exits, config, I/O
    {"data", "distributed", "spark_session", "spark_start"},  # datasets; Horovod's home; Spark
    {"model"},                                  # the network, its file, its top-K
    {"tracking"},                               # MLflow: runs, registry, pyfunc flavour
    {"evaluation"},                             # metrics, backtest, gate
    {"serving"},                                # deploy, batch scoring
    {"train"},                                  # the program, the loops, the Spark routes
    {"api", "cli", "doctor", "doctor_distributed"},  # what users call
]
TOP_LEVEL_MODULES_AT_MOST = 10  # hvd_ctsm/*.py beside the folders (issue: a visible tree)


def layer_of(module: str) -> int | None:
    """The layer of an hvd_ctsm module (its folder's for a module in a folder); programs
    (__main__.py) sit above every layer; None outside hvd_ctsm."""
    parts = module.split(".")
    if parts[0] != "hvd_ctsm":
        return None
    if parts[-1] == "__main__":
        return len(LAYERS)
    name = parts[1] if len(parts) > 1 else "hvd_ctsm"
    found = [i for i, layer in enumerate(LAYERS) if name in layer]
    assert found, f"{module} is in no layer: add it to LAYERS (and README's list)"
    return found[0]


def test_every_module_imports_only_its_layer_and_below():
    upward = sorted(f"{name} (layer {layer_of(name)}) -> {target} (layer {layer_of(target)})"
                    for name, targets in import_graph().items() if layer_of(name) is not None
                    for target in targets
                    if layer_of(target) is not None and layer_of(target) > layer_of(name))
    assert upward == []


def test_the_layer_check_sees_an_upward_import():
    assert (layer_of("hvd_ctsm.data.batches") < layer_of("hvd_ctsm.train.trainer")
            < layer_of("hvd_ctsm.cli"))
    assert layer_of("hvd_ctsm.tracking.runs") == layer_of("hvd_ctsm.tracking")
    assert layer_of("hvd_ctsm.model.ctsm") < layer_of("hvd_ctsm.serving.score")
    assert layer_of("hvd_ctsm.train.__main__") == len(LAYERS) and layer_of("spark_jobs.x") is None


def test_importing_the_package_its_config_gate_and_deploy_loads_no_torch_spark_or_horovod():
    """The gate and deploy commands copy and check files: torch cost each of them 2-4 s of
    start (a deploy on a small driver, a scheduler's many gates)."""
    code = ("import sys, hvd_ctsm, hvd_ctsm.config, hvd_ctsm.data.schema, hvd_ctsm.files.atomic, "
            "hvd_ctsm.evaluation.gate, hvd_ctsm.serving.deploy; "
            "print(sorted(m for m in ('torch', 'pyspark', 'horovod') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_notebook_functions_have_names_no_module_uses():
    """No module is swapped for a function of its name: the notebook API has its own names."""
    from hvd_ctsm import api
    names = {"make_features", "train_model", "backtest_model", "score_clients"}
    assert all(callable(getattr(api, name)) for name in names)
    assert not names & {module.rpartition(".")[2] for module in our_modules()}
    assert not [path for path in our_modules().values() if "make_callable" in path.read_text()]


def test_the_package_is_folders_with_few_top_level_modules_each_saying_what_it_owns():
    package = REPO / "hvd_ctsm"
    top_level = sorted(p.name for p in package.glob("*.py"))
    assert len(top_level) <= TOP_LEVEL_MODULES_AT_MOST, top_level
    folders = sorted(p.parent.name for p in package.glob("*/__init__.py"))
    assert {name for layer in LAYERS for name in layer} >= set(folders)
    for folder in folders:
        doc = ast.get_docstring(ast.parse((package / folder / "__init__.py").read_text()))
        assert doc and len(doc.split()) >= 15, f"hvd_ctsm/{folder}/__init__.py: say what it owns"


def test_the_network_imports_only_torch():
    """The model knows nothing of distribution, datasets or files: the encoder, its heads and
    its catalog losses import torch (numpy, the standard library), each other and the typed
    config they are built from (CTSM(sizes, ModelConfig), as litgpt's GPT(config)) only."""
    network = ("hvd_ctsm.model.ctsm", "hvd_ctsm.model.heads", "hvd_ctsm.model.catalog")
    config = "hvd_ctsm.config.model_config"
    graph = import_graph()
    for name in network:
        path = our_modules()[name]
        third_party = {n.split(".")[0] for n in imported_names(ast.parse(path.read_text()))}
        allowed = {"hvd_ctsm", "torch", "numpy", "__future__"} | set(sys.stdlib_module_names)
        assert third_party <= allowed, (name, third_party - allowed)
        assert graph[name] <= set(network) | {"hvd_ctsm.model", config}, (name, graph[name])
    assert graph[config] <= {"hvd_ctsm.config.types"}, graph[config]  # a plain dataclass
