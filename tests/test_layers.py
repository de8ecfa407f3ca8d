"""Imports point one way: cli -> (api, tune) -> rollout (the dataset job) -> runtime (training) ->
data (dataset formats) -> tracking -> algos -> nets, with spec, envs and small utilities at the
bottom; no two folders import each other, except within the bottom group; Ray only where actors
are made and driven.

The rule test reads every module under aa_ray/ with `ast` (imports inside functions and under
TYPE_CHECKING count too: they are dependencies all the same) and lists every offending import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "aa_ray"

BOTTOM = ("aa_ray.algos", "aa_ray.nets", "aa_ray.spec", "aa_ray.envs", "aa_ray.seeding", "aa_ray.metric_names",
          "aa_ray.ddp")
UPPER = ("aa_ray.rollout", "aa_ray.runtime", "aa_ray.tune", "aa_ray.data", "aa_ray.tracking", "aa_ray.api",
         "aa_ray.cli")

# (importer, what it must not import): the layers of the package
FORBIDDEN: list[tuple[tuple[str, ...], tuple[str, ...]]] = [
    (BOTTOM, UPPER),
    # the envs describe observations with the records' types (`records.ObsDims`), not the networks'
    (("aa_ray.envs",), ("aa_ray.nets", "aa_ray.algos")),
    (("aa_ray.rollout",), ("aa_ray.tune", "aa_ray.api", "aa_ray.cli")),
    (("aa_ray.runtime",), ("aa_ray.rollout", "aa_ray.tune", "aa_ray.api", "aa_ray.cli")),
    # the dataset formats sit below the runtime, whose replay buffer and trainer read them
    (("aa_ray.data",), ("aa_ray.runtime", "aa_ray.rollout", "aa_ray.tune", "aa_ray.api", "aa_ray.cli")),
    (("aa_ray.tracking",), ("aa_ray.runtime", "aa_ray.rollout", "aa_ray.tune", "aa_ray.data", "aa_ray.api",
                            "aa_ray.cli")),
    (("aa_ray.tune",), ("aa_ray.api", "aa_ray.cli")),
    (("aa_ray.api",), ("aa_ray.cli",)),
]

# The only modules that may import Ray (at module level or inside a function): the cluster helpers
# that make the Ray actor shells, the driver and its loops and waits (lazily: an inline run imports
# no Ray), the metrics exporter (lazily, a no-op without Ray), Tune and the command line. The actor
# graph, the inline shells (`runtime/inline.py`) and the rollout driver (it drives an actor graph)
# are not among them.
RAY_ALLOWED = (
    "aa_ray.cli",
    "aa_ray.runtime.cluster",
    "aa_ray.runtime.loops",
    "aa_ray.runtime.metrics",
    "aa_ray.runtime.remote",
    "aa_ray.runtime.trainer",
    "aa_ray.tune",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    return imports_in(path.read_text(), module_name(path), is_package=path.name == "__init__.py")


def imports_in(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, imported module) for every import in `module`'s source; `from a import b` yields a.b
    as well as a, since b may be a submodule."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in prefixes)


def all_modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def against_the_layers(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None."""
    for importers, forbidden in FORBIDDEN:
        if within(importer, importers) and within(imported, forbidden):
            return f"{importer} is below {', '.join(forbidden)}"
    return None


def test_imports_point_one_way() -> None:
    offences = {
        f"{path.relative_to(ROOT)}:{line} imports {imported} ({why})"
        for path in all_modules()
        for line, imported in imports(path)
        if (why := against_the_layers(module_name(path), imported))
    }
    assert not offences, "imports against the layers:\n" + "\n".join(sorted(offences))


def test_ray_is_imported_only_where_actors_are_made_and_driven() -> None:
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for path in all_modules()
        if not within(module_name(path), RAY_ALLOWED)
        for line, imported in imports(path)
        if within(imported, ("ray",))
    ]
    assert not offences, "Ray imported outside RAY_ALLOWED:\n" + "\n".join(sorted(set(offences)))


def variant_modules() -> set[str]:
    """The modules that define a registered algorithm (sac.py, ppo.py, ... and any added later)."""
    from aa_ray.algos.registry import ALGORITHMS

    return {entry.algorithm.__module__ for entry in ALGORITHMS.values()}


def test_the_runtime_knows_algorithm_families_not_algorithms() -> None:
    """No runtime module imports an algorithm's own file or asks whether it learns on-policy: what
    differs between algorithms reaches the runtime through their family (runtime/families.py)."""
    variants = variant_modules()
    assert {"aa_ray.algos.sac", "aa_ray.algos.ppo"} <= variants
    runtime = [path for path in all_modules() if within(module_name(path), ("aa_ray.runtime",))]
    offences = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for path in runtime for line, imported in imports(path) if within(imported, tuple(variants))
    ]
    for path in runtime:
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
            if name in ("on_policy", "is_on_policy", "ppo_epochs", "num_minibatches"):
                offences.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {name}")
    assert not offences, "the runtime knows an algorithm by name:\n" + "\n".join(offences)


def executed_imports(path: Path) -> set[str]:
    """The aa_ray modules `path` imports when it runs (inside functions too), not the ones named for
    type checkers only (under `if TYPE_CHECKING:`), each resolved to the module that exists."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(child) for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for statement in node.body for child in ast.walk(statement)
    }
    known = {module_name(p) for p in all_modules()}
    source = "\n".join(
        ast.unparse(node) for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in type_only
    )
    found = set()
    for _, imported in imports_in(source, module_name(path), is_package=path.name == "__init__.py"):
        while imported and imported not in known:
            imported = imported.rpartition(".")[0]
        if imported.startswith("aa_ray") and imported != module_name(path):
            found.add(imported)
    return found


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in graph.get(module, ()):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return cycles


def test_no_module_imports_itself_back() -> None:
    """No import cycle inside aa_ray: every module can be read (and imported) after the ones it needs."""
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder finds
    graph = {module_name(path): executed_imports(path) for path in all_modules()}
    assert sum(len(deps) for deps in graph.values()) > 100
    assert not import_cycles(graph), import_cycles(graph)


def folder_of(module: str) -> str:
    """The folder (package) or top-level module of aa_ray that `module` belongs to."""
    return ".".join(module.split(".")[:2])


def folder_cycles(module_imports: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles between folders, given each module's aa_ray imports, other than those within
    the bottom group (whose folders build on each other by design, see docs/architecture.md)."""
    graph: dict[str, set[str]] = {}
    for importer, imported in module_imports.items():
        graph.setdefault(folder_of(importer), set()).update(
            folder_of(module) for module in imported if folder_of(module) not in ("aa_ray", folder_of(importer))
        )
    return [cycle for cycle in import_cycles(graph) if not all(within(folder, BOTTOM) for folder in cycle)]


def test_no_two_folders_import_each_other() -> None:
    """A folder-level cycle (data/ importing runtime/ while runtime/ imports data/) is refused even
    when each import on its own is allowed by FORBIDDEN; type-only imports count, as in the layers."""
    reintroduced = {"aa_ray.data.dataset": {"aa_ray.runtime.graph"}, "aa_ray.runtime.replay": {"aa_ray.data.dataset"},
                    "aa_ray.spec.experiment": {"aa_ray.algos.registry"}, "aa_ray.algos.sac": {"aa_ray.spec.base"}}
    # the finder finds the cycle, and lets the bottom group's pass
    assert folder_cycles(reintroduced) == [["aa_ray.data", "aa_ray.runtime"]]
    module_imports = {
        module_name(path): {imported for _, imported in imports(path) if within(imported, ("aa_ray",))}
        for path in all_modules()
    }
    cycles = folder_cycles(module_imports)
    assert not cycles, "folders in one import cycle: " + "; ".join(" <-> ".join(cycle) for cycle in cycles)


def test_the_rule_reads_imports_inside_functions_and_relative_ones() -> None:
    """The reader itself: a module that tucks its imports away is still read."""
    source = "def f():\n    import ray.util\n    from ..runtime import trainer\n    from . import training\n"
    found = {imported for _, imported in imports_in(source, "aa_ray.algos.probe")}
    assert {"ray.util", "aa_ray.runtime", "aa_ray.runtime.trainer", "aa_ray.algos.training"} <= found
    assert against_the_layers("aa_ray.algos.probe", "aa_ray.runtime.trainer")
    assert against_the_layers("aa_ray.data.dataset", "aa_ray.runtime.graph")
    assert against_the_layers("aa_ray.runtime.trainer", "aa_ray.rollout.job")
    assert against_the_layers("aa_ray.rollout.job", "aa_ray.runtime.graph") is None
    assert against_the_layers("aa_ray.envs.make", "aa_ray.tracking.mlflow_tracker")
    assert against_the_layers("aa_ray.envs.make", "aa_ray.nets.policy")
    assert against_the_layers("aa_ray.envs.make", "aa_ray.nets.policy")
    assert against_the_layers("aa_ray.runtime.env_runner", "aa_ray.data.dataset") is None
    assert against_the_layers("aa_ray.tune.sweep", "aa_ray.runtime.trainer") is None


WITHOUT_RAY = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class NoRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r} (made unimportable by the test)")
            return None

    sys.meta_path.insert(0, NoRay())

    import numpy as np

    from aa_ray.envs import env_dims
    from aa_ray.runtime.env_runner import EnvRunner
    from aa_ray.runtime.learner import Learner
    from aa_ray.runtime.replay import ReplayBuffer
    from aa_ray.spec.loader import load_spec

    small = ["algo.actor_hidden_dims=[16]", "algo.critic_hidden_dims=[16]", "algo.batch_size=4"]
    spec = load_spec("specs/sac.yaml", ["runners.envs_per_runner=2", *small])
    obs, act_dim = env_dims(spec)
    obs_dim = obs.full
    runner = EnvRunner(spec, index=0)
    warm_up, stats = runner.sample(5, random_actions=True)
    acting, _ = runner.sample(5, random_actions=False)
    assert stats.env_steps == 10 and warm_up.obs.shape == (10, obs_dim), stats
    assert np.isfinite(runner.evaluate(1)["eval/return"])
    replay = ReplayBuffer(100, obs_dim, act_dim, seed=spec.seed)
    assert replay.add(warm_up, acting) == 20
    batch = replay.sample(3, 4)
    assert batch.obs.shape == (3, 4, obs_dim) and batch.action.shape == (3, 4, act_dim)
    learner = Learner(spec, obs_dim, act_dim)
    before, _ = learner.policy_state()
    info = learner.update([stats.moments], batch).metrics
    after, version = learner.policy_state()
    assert info["learner/gradient_updates"] == 3 and np.isfinite(info["critic/q_loss"]) and version == 1, info
    assert any((after[name] != before[name]).any() for name in before), "the update changed no policy weight"
    assert not [name for name in sys.modules if name == "ray" or name.startswith("ray.")]
    print("sampled and trained without ray")
    """
)


def test_the_env_runner_replay_and_learner_run_where_ray_cannot_be_imported() -> None:
    result = subprocess.run([sys.executable, "-c", WITHOUT_RAY], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sampled and trained without ray" in result.stdout
