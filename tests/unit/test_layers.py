"""Imports run one way: down the flow, never back up, and no module imports one that imports it back.

Every ``src/tempering`` file's imports are read from its syntax tree, those inside functions
too (a lazy import is still a dependency, only a later one). Each module belongs to a *part*:
its folder, or for a module at the top its own name. :data:`ALLOWED` says which other parts
each part may import; a part not in the table (a new loose module at the top, a new folder)
fails until it is placed there on purpose. :data:`PURE_MATHS` names the parts that hold maths
on tensors only: they may not build or run a model.
"""

import ast
from pathlib import Path

import tempering

ROOT = Path(tempering.__file__).parent

FOUNDATIONS = {"tempering", "config", "types", "registry", "faults", "threads", "httpd"}
"""What every layer may use: typed config, the data types, the registry mechanism, the kill
points and TrainingDiverged, the CPU thread count, the HTTP server base that the sandbox's
service and ``temper serve`` share (``tempering`` is the package itself)."""

BELOW_BUILD = {"algorithms", "models", "sandbox", "checkpoint", "rollout", "rewards", "envs", "tasks",
               "scheduler", "learner", "eval", "reporting", "pipeline", "placement", "versions"}
COMMANDS = {"train", "sft", "dpo", "pretrain", "rm", "prm", "prm_label", "eval_model", "serve_model", "explain"}

ALLOWED: dict[str, set[str]] = {
    **{name: FOUNDATIONS for name in FOUNDATIONS},
    # the bottom: maths on tensors, model loading, the sandbox, and checkpoints over models (with
    # the run folder, whose step logs resume cuts back)
    "algorithms": FOUNDATIONS,
    "models": FOUNDATIONS,
    "sandbox": FOUNDATIONS,
    "checkpoint": FOUNDATIONS | {"models", "reporting"},
    # CUDA-only torch extensions hidden beside a CPU torch: imported by the package itself, so it imports nothing
    "torch_extensions": set(),
    # the middle, in the order of the flow: sampling, rewards, episodes, tasks, what comes next
    # (vLLM is handed the learner's model as a saved folder, and its processes the extension shim)
    "rollout": FOUNDATIONS | {"models", "sandbox", "checkpoint", "torch_extensions"},
    "rewards": FOUNDATIONS | {"algorithms", "models", "sandbox"},
    "envs": FOUNDATIONS | {"rollout", "rewards", "sandbox"},
    "tasks": FOUNDATIONS | {"envs", "rewards", "rollout", "sandbox"},
    "scheduler": FOUNDATIONS | {"tasks"},
    "learner": FOUNDATIONS | {"algorithms", "models"},
    "eval": FOUNDATIONS | {"rewards", "rollout", "tasks"},
    "reporting": FOUNDATIONS,
    "pipeline": FOUNDATIONS | {"placement", "rollout", "versions"},
    # which weights each async round samples with, and how stale each rollout is
    "versions": FOUNDATIONS,
    "placement": FOUNDATIONS,
    # pre-training makes builtin:tiny and, by their recipes (lists of task specs),
    # builtin:generalist and builtin:tiny-long, which build resolves; build makes everything below it
    "pretrain": FOUNDATIONS | {"learner", "models", "tasks", "generalist", "tiny_long"},
    "generalist": FOUNDATIONS,
    "tiny_long": FOUNDATIONS,
    # the policy a config names: the model (pre-trained or converted on first use, or a run
    # folder's checkpoint), its device (the learner's under torchrun) and precision (the sampler's
    # fused kernels timed)
    "policy": FOUNDATIONS | {"checkpoint", "learner", "models", "pretrain", "rollout"},
    "build": FOUNDATIONS | BELOW_BUILD | {"policy", "pretrain"},
    # the commands, then the argument parser over them
    **{name: FOUNDATIONS | BELOW_BUILD | {"build", "policy", "pretrain"} for name in COMMANDS - {"pretrain"}},
    # temper dpo runs its rows through temper sft's forward passes (Passes, example_tensors)
    "dpo": FOUNDATIONS | BELOW_BUILD | {"build", "policy", "pretrain", "sft"},
    "cli": FOUNDATIONS | BELOW_BUILD | COMMANDS,
    # the Python API: the commands as functions, beside the command line
    "api": FOUNDATIONS | BELOW_BUILD | COMMANDS | {"build", "policy"},
    # the package itself: the API's names, imported on first use (and for type checkers)
    "tempering": FOUNDATIONS | BELOW_BUILD | {"api", "torch_extensions"},
    # the sitecustomize of vLLM's processes: it imports the package, for the shim above
    "vllm_site": {"tempering"},
}

PURE_MATHS = {"algorithms"}
"""Parts that hold maths on tensors: no ``torch.nn`` module (a layer, a parameter, its init;
``torch.nn.functional`` is maths), nothing from ``transformers`` or ``peft``. Running a model
is the learner's (``learner/forward.py``, ``learner/critic.py``)."""

MODEL_LIBRARIES = ("transformers", "peft")


def dotted(node: ast.AST) -> str:
    """``torch.nn.Linear`` of an attribute chain on a name, else ''."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(names)]) if isinstance(node, ast.Name) else ""


def model_code(source: str) -> list[str]:
    """What in ``source`` builds or runs a model: imports of the model libraries or of
    ``torch.nn`` beyond ``functional``, and uses of ``torch.nn.X`` for any other ``X``."""
    def is_model(name: str) -> bool:
        return (name.split(".")[0] in MODEL_LIBRARIES
                or (name == "torch.nn" or name.startswith("torch.nn.")) and not name.startswith("torch.nn.functional"))

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if is_model(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{node.module}.{alias.name}" for alias in node.names if is_model(f"{node.module}.{alias.name}")]
        elif isinstance(node, ast.Attribute) and dotted(node).count(".") == 2 and is_model(dotted(node)):
            found.append(dotted(node))
    return found


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("tempering",) + path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The tempering modules ``path`` imports, anywhere in it: ``from P import n`` counts as
    importing module ``P.n`` when there is one, else ``P``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "tempering"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tempering":
            found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                      for a in node.names}
    return found


def part(module: str) -> str:
    names = module.split(".")
    return names[1] if len(names) > 1 else "tempering"


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(path, set(found)) - {name} for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
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


def test_every_part_has_a_place_in_the_table():
    unplaced = sorted({part(name) for name in modules()} - set(ALLOWED))
    assert not unplaced, f"parts without a row in ALLOWED (a module loose at the top, or a new folder): {unplaced}"


def test_imports_run_down_the_table():
    wrong = [f"{source} imports {target}" for source, targets in sorted(graph().items()) for target in sorted(targets)
             if part(target) != part(source) and part(target) not in ALLOWED.get(part(source), set())]
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(graph()) == []


def test_the_checks_find_a_back_import_and_a_cycle():
    edges = {"tempering.models.loading": {"tempering.pretrain"}, "tempering.pretrain": {"tempering.learner.step"},
             "tempering.learner.step": {"tempering.models.loading"}, "tempering.types": set()}
    assert cycles(edges) == [["tempering.learner.step", "tempering.models.loading", "tempering.pretrain"]]
    assert "pretrain" not in ALLOWED[part("tempering.models.loading")]
    assert part("tempering.eval.greedy") == "eval" and part("tempering.build") == "build"


def test_the_pure_maths_parts_build_and_run_no_model():
    found = {name: model_code(path.read_text(encoding="utf-8")) for name, path in modules().items()
             if part(name) in PURE_MATHS}
    assert not {name: uses for name, uses in found.items() if uses}, found


def test_the_model_check_finds_a_layer_and_lets_functional_maths_pass():
    layer = "import torch\nhead = torch.nn.Linear(4, 1)\ntorch.nn.init.zeros_(head.bias)\n"
    assert model_code(layer) == ["torch.nn.Linear", "torch.nn.init"]
    assert model_code("from transformers import AutoModel\nfrom torch import nn\n") == ["transformers.AutoModel",
                                                                                        "torch.nn"]
    assert model_code("import torch\nx = torch.nn.functional.pad(torch.zeros(2), (1, 0))\n") == []
