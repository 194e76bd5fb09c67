"""The repo's layers, and the one direction its imports may run (function-level imports included, so none
can hide an arrow). A module may import its own package and any layer below its own, never one above:

    errors.py, parsing.py, cli.py,        import nothing of the repo but each other: every layer uses them
    storage/files.py
    model/                                the architecture
    tasks/                                the synthetic tasks, one file each (the capability map's)
    settings.py                           the schema of configs/ and the composition of a config
    data/                                 corpora, the tokenizer, the token caches
    storage/                              checkpoints
    interop/                              transformers' and llama.cpp's formats
    training/ | generation/               train.py's helpers | sampling and the KV-cache estimator (siblings:
                                          neither imports the other)
    insight/                              report.py's measurements, drawn from training's and generation's
    benchmarks/ | study/                  bench.py's peers, timers and tables | compare.py's and sweep.py's runs,
                                          tables and launches (siblings)
    the scripts                           every other root module (train.py, generate.py, ...) and scripts/

The layers are named by package, so a new file in a package needs no change here; a new package does."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASE = {"errors", "parsing", "cli", "storage.files"}
LAYERS = ["model", "tasks", "settings", "data", "storage", "interop", ("training", "generation"), "insight",
          ("benchmarks", "study")]


def layer(module: str) -> tuple[int, str]:
    """(rank, group): an import may run to a lower rank, or within its own group."""
    if module in BASE:
        return 0, "base"
    group = module.split(".")[0]
    for rank, names in enumerate(LAYERS, start=1):
        if group in ((names,) if isinstance(names, str) else names):
            return rank, group
    return len(LAYERS) + 1, "scripts"


def repo_modules(root: Path) -> dict[str, Path]:
    """Every module of the repo at `root`: the root's own, each package's and sub-package's (a folder with an
    __init__.py, such as interop/families/) and scripts/'."""
    modules = {path.stem: path for path in root.glob("*.py")}
    packages = [init.parent for init in root.glob("*/__init__.py")] + [root / "scripts"]
    packages += [init.parent for package in packages for init in package.glob("**/__init__.py") if init.parent != package]
    for package in packages:
        name = ".".join(package.relative_to(root).parts)
        for path in package.glob("*.py"):
            modules[name if path.stem == "__init__" else f"{name}.{path.stem}"] = path
    return modules


def imports(path: Path, modules: dict) -> set[str]:
    """The repo modules `path` imports anywhere in its code: `import a.b` names a.b, `from a import b`
    names a.b when that is a module and a (its __init__) otherwise. A package's own __init__ running
    before its submodules is Python's order of loading, not a dependency, so it is not an edge."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names]
        else:
            continue
        found |= set(names) & modules.keys()
    return found


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    modules = repo_modules(root)
    return {name: imports(path, modules) - {name} for name, path in modules.items()}


def backward_imports(edges: dict[str, set[str]]) -> list[str]:
    """Each import that runs up a layer or across to a sibling, as 'importer -> imported'."""
    return [f"{module} -> {other}" for module, deps in sorted(edges.items()) for other in sorted(deps)
            if layer(other)[0] >= layer(module)[0] and layer(other)[1] != layer(module)[1]]


def test_every_import_runs_down_the_layers():
    wrong = backward_imports(graph())
    assert not wrong, "; ".join(wrong)


def test_the_layers_name_every_package():
    packages = {init.parent.name for init in ROOT.glob("*/__init__.py")}
    placed = {name for names in LAYERS for name in ((names,) if isinstance(names, str) else names)}
    assert packages <= placed, f"place {sorted(packages - placed)} in LAYERS (and README's file tree)"


def write_repo(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_a_backward_import_is_caught_and_a_new_file_is_not(tmp_path):
    write_repo(tmp_path, {
        "errors.py": "",
        "model/__init__.py": "", "model/attention.py": "from errors import UsageError\n",
        "model/probe.py": "def f():\n    from storage.checkpoint import load_checkpoint\n",  # up two layers
        "data/__init__.py": "", "data/new_corpus.py": "from model import attention\nimport storage.files\n",
        "storage/__init__.py": "", "storage/files.py": "", "storage/checkpoint.py": "import model.attention\n",
        "training/__init__.py": "", "training/loop.py": "from generation.engine import Engine\n",  # a sibling
        "generation/__init__.py": "", "generation/engine.py": "from storage.checkpoint import load_checkpoint\n",
        "train.py": "import training.loop\nfrom model import probe\n",
        "scripts/study.py": "import train\n"})
    edges = graph(tmp_path)
    assert edges["data.new_corpus"] == {"model.attention", "storage.files"} and edges["scripts.study"] == {"train"}
    assert backward_imports(edges) == ["model.probe -> storage.checkpoint", "training.loop -> generation.engine"]


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    state, cycles = {}, []

    def visit(module, stack):
        state[module] = "open"
        for other in sorted(edges.get(module, ())):
            if state.get(other) == "open":
                cycles.append(stack[stack.index(other):] + [other])
            elif other not in state:
                visit(other, stack + [other])
        state[module] = "done"
    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    return cycles


def test_no_import_cycle_anywhere():
    """Within a package the layers allow any arrow, so a cycle there is what this catches."""
    cycles = find_cycles(graph())
    assert not cycles, " ; ".join(" -> ".join(cycle) for cycle in cycles)


def test_a_cycle_is_found_when_there_is_one(tmp_path):
    """The walk itself, on a cycle through three modules of one package, beside a module outside it."""
    write_repo(tmp_path, {"model/__init__.py": "", "model/kv_cache.py": "from model.checkpoint import load\n",
                          "model/checkpoint.py": "import model.transformer\n",
                          "model/transformer.py": "from model import kv_cache\n", "model/norms.py": "import torch\n"})
    edges = graph(tmp_path)
    assert edges["model.transformer"] == {"model.kv_cache"} and edges["model.norms"] == set()
    assert find_cycles(edges) == [["model.checkpoint", "model.transformer", "model.kv_cache", "model.checkpoint"]]
