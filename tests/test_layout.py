"""The repo's layout: no module's imports form a cycle (function-level imports included, so none can
hide one), and model/ is the architecture, importing nothing of this repo outside itself."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("model", "data", "training", "generation", "storage", "interop", "insight")


def repo_modules() -> dict[str, Path]:
    modules = {path.stem: path for path in ROOT.glob("*.py")}
    for package in PACKAGES:
        for path in (ROOT / package).glob("*.py"):
            modules[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
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


def graph() -> dict[str, set[str]]:
    modules = repo_modules()
    return {name: imports(path, modules) - {name} for name, path in modules.items()}


def test_the_layout_is_what_the_readme_shows():
    modules = repo_modules()
    assert {"model.config", "model.norms", "model.positions", "model.attention", "model.ffn", "model.block",
            "model.transformer", "model.kv_cache"} == {m for m in modules if m.startswith("model.")}
    assert {"generation.engine", "generation.kv_memory", "storage.checkpoint",
            "storage.files", "interop.hf_llama", "training.settings"} <= modules.keys()


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
    cycles = find_cycles(graph())
    assert not cycles, " ; ".join(" -> ".join(cycle) for cycle in cycles)


def test_a_cycle_is_found_when_there_is_one(tmp_path):
    """The walk itself, on the shape issue 16 found (kv_cache -> checkpoint -> transformer -> kv_cache)."""
    (tmp_path / "model").mkdir()
    files = {"model.kv_cache": "from model.checkpoint import load\n", "model.checkpoint": "import model.transformer\n",
             "model.transformer": "from model import kv_cache\n", "model.norms": "import torch\n"}
    modules = {name: tmp_path / f"{name.replace('.', '_')}.py" for name in files}
    for name, text in files.items():
        modules[name].write_text(text)
    edges = {name: imports(path, modules) - {name} for name, path in modules.items()}
    assert edges["model.transformer"] == {"model.kv_cache"} and edges["model.norms"] == set()
    assert find_cycles(edges) == [["model.checkpoint", "model.transformer", "model.kv_cache", "model.checkpoint"]]


def test_model_imports_nothing_of_the_repo_outside_model():
    outside = {module: sorted(m for m in deps if not m.startswith("model"))
               for module, deps in graph().items() if module.startswith("model")}
    assert all(not deps for deps in outside.values()), outside
