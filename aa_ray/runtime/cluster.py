"""Connecting to Ray, reserving a run's resources as one placement group (its bundles are
`ExperimentSpec.bundles()`: the learners, the replay actor in learner 0's, then the env runners) and making
the run's Ray actors in it (`RayActors`).

Ray is imported inside the functions: the command line imports this module for its errors on
every run, and a `runtime.backend: inline` run must not import Ray.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:  # not at run time: an actor process that unpickles a helper below imports this module
    from ray.util.placement_group import PlacementGroup
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from aa_ray.spec.experiment import ExperimentSpec

TASK_EVENTS_KEPT = 10_000
# runtime.placement -> the placement group's strategy. Both are soft: when a node is lost, Ray
# re-places its bundles on the surviving nodes that have room (STRICT_* would wait for a new node).
PLACEMENT_STRATEGIES = {"pack": "PACK", "spread": "SPREAD"}
# How long to wait for Ray's verdict on an actor it cannot reach: the GCS declares a node dead after
# its health checks fail (by default 5 checks 3 s apart, each allowed 10 s: 15 s for a raylet that
# ended, about a minute for a host that vanished). Until then the actor is only "unavailable".
NODE_VERDICT_S = 120.0


class NodeLoss(NamedTuple):
    """A node the cluster lost with some of the run's actors on it."""

    node_id: str
    ip: str
    actors: list[str]  # the run's actors it held ("learner 0", "replay", "env runner 2", ...)


class ResourceError(RuntimeError):
    """The cluster cannot hold the actors the spec asks for."""


def connect(spec: ExperimentSpec | None, cpus: float | None = None, py_modules: Sequence[str] = (),
            log_to_driver: bool = True) -> bool:
    """Join `RAY_ADDRESS` when set, else start an embedded local Ray sized for the spec (or for
    `cpus`, e.g. a sweep's concurrent trials). The spec's `env.py_modules` (else `py_modules`) go to
    every worker in the job's runtime env. `log_to_driver=False`: the workers' output stays in their
    own logs instead of being printed here (a sweep's trials write their own). Returns True when
    this call started Ray (and so should shut it down)."""
    import ray

    if ray.is_initialized():
        return False
    # No env_vars: Ray itself gives each worker OMP_NUM_THREADS of its actor's CPUs (1 for a runner
    # or the replay actor), and the actors set their torch threads. Any runtime env at all starts
    # every worker through Ray's setup_worker.py and its runtime-env agent: about 0.4 s more CPU per
    # actor or Tune trial (benchmarks/RESULTS.md section 31).
    runtime_env: dict[str, Any] = {}
    py_modules = spec.env.py_modules if spec is not None else py_modules
    if py_modules:  # the user's env packages: Ray zips each folder and puts it on every worker's path
        runtime_env["py_modules"] = [os.path.abspath(path) for path in py_modules]
    if os.environ.get("RAY_ADDRESS"):
        # Ray merges this with a submitted job's runtime env and refuses keys set in both: the job's win
        job_env = _job_config().get("runtime_env") or {}
        ray.init(runtime_env={key: value for key, value in runtime_env.items() if key not in job_env} or None,
                 log_to_driver=log_to_driver)
        return True
    needed = cpus if cpus is not None else sum(bundle.get("CPU", 0) for bundle in spec.bundles())
    ray.init(
        address="local",  # always a fresh embedded Ray, never a stray `ray start` cluster on this host
        num_cpus=max(math.ceil(needed), os.cpu_count() or 1),
        include_dashboard=False,
        runtime_env=runtime_env or None,
        log_to_driver=log_to_driver,
        # The GCS keeps a record of every actor call (about 3 KB each, up to 100k by default): a long
        # run's GCS grew by 36 MB per 100k env steps (benchmarks/RESULTS.md section 10). 10k
        # records still cover the last minutes of a run for debugging.
        # Ray would also start one idle worker per CPU for the first driver: aa-ray's actors and Tune's
        # trials each get a worker of their own, so those were never used, and cost ~0.5 s of CPU apiece.
        _system_config={"task_events_max_num_task_in_gcs": TASK_EVENTS_KEPT, "prestart_worker_first_driver": False},
    )
    return True


def disconnect(started_ray: bool) -> None:
    """Shut down the Ray that `connect` started (a joined cluster stays up)."""
    if started_ray:
        import ray

        ray.shutdown()


def timeline(spec: ExperimentSpec) -> list[dict[str, Any]]:
    """Every actor call of this Ray session as Chrome-trace events (none for an inline run)."""
    if spec.runtime.backend != "ray":
        return []
    import ray

    return ray.timeline()


def check_capacity(bundles: list[dict[str, float]], what: str = "the spec") -> None:
    """ResourceError, naming the resource, if the whole cluster could never hold these bundles."""
    import ray

    wanted: dict[str, float] = {}
    for bundle in bundles:
        for resource, amount in bundle.items():
            wanted[resource] = wanted.get(resource, 0.0) + amount
    total = ray.cluster_resources()
    for resource, amount in wanted.items():
        if total.get(resource, 0.0) < amount:
            raise ResourceError(
                f"{what} needs {amount:g} {resource} in total (bundles {bundles}) but the Ray cluster "
                f"has {total.get(resource, 0.0):g}; lower runners.*/learners.* resources or add nodes."
            )


def _job_config() -> dict:
    """The job config Ray gives the driver of a `ray job submit` job ({} for any other process)."""
    try:
        config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR") or "{}")
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def submitted_job_id() -> str | None:
    """The submission id when this process is the driver of a `ray job submit` job, else None."""
    return (_job_config().get("metadata") or {}).get("job_submission_id")


def job_tracking_problem(tracking: bool) -> str | None:
    """Why a submitted job's MLflow record would be lost, or None. A job runs in a temporary copy of
    its working dir on the head node; without MLFLOW_TRACKING_URI the default store
    (./mlflow.db) would be written there and deleted with it."""
    job = submitted_job_id()
    if job is None or not tracking or os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    return (
        f"this is Ray job {job}, and MLFLOW_TRACKING_URI is not set: the run would be recorded in "
        f"{os.getcwd()}/mlflow.db, inside the job's temporary working dir, and lost with it. Point it at a "
        "tracking server every node can reach, e.g. ray job submit --runtime-env-json "
        "'{\"env_vars\": {\"MLFLOW_TRACKING_URI\": \"http://<mlflow host>:5000\"}}' ..., or pass --no-track."
    )


def reserve(spec: ExperimentSpec, bundles: list[dict[str, float]] | None = None) -> PlacementGroup:
    """Create the run's placement group (`spec.bundles()` unless `bundles` is given); fail fast,
    naming the resource, if the cluster cannot hold it or cannot place it in time."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    bundles = spec.bundles() if bundles is None else bundles
    check_capacity(bundles)
    group = placement_group(bundles, strategy=PLACEMENT_STRATEGIES[spec.runtime.placement])
    ready, _ = ray.wait([group.ready()], timeout=spec.runtime.resource_timeout_s)
    if not ready:
        remove_placement_group(group)
        raise ResourceError(
            f"the cluster could not place bundles {bundles} within {spec.runtime.resource_timeout_s:g}s "
            f"(available now: {ray.available_resources()}); other jobs may hold the resources."
        )
    return group


def placement(
    spec: ExperimentSpec, bundles: list[dict[str, float]] | None = None
) -> tuple[PlacementGroup, int, bool]:
    """(group, bundle offset, whether the caller owns the group) for a run's actors (`spec.bundles()`
    unless `bundles` is given). Inside a Tune trial the trial's own placement group already holds
    them after bundle 0, the trial's driver (see `aa_ray.tune.trials`); anywhere else the run
    reserves its own group."""
    import ray

    bundles = spec.bundles() if bundles is None else bundles
    current = ray.util.get_current_placement_group()
    if current is not None and current.bundle_specs[1:] == bundles:
        return current, 1, False
    return reserve(spec, bundles), 0, True


def in_bundle(group: PlacementGroup, index: int) -> PlacementGroupSchedulingStrategy:
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def bundle_node_ip(group: PlacementGroup, index: int) -> str:
    """The IP address of the node that holds bundle `index` of a placed group (what
    `ray.util.get_node_ip_address()` returns on that node)."""
    import ray

    node_id = ray.util.placement_group_table(group)["bundles_to_node_id"][index]
    addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"]}
    return addresses[node_id]


def _set_torch_threads(instance: Any, threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def _node_id(instance: Any) -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def _nodes() -> dict[str, tuple[bool, str]]:
    """Node id -> (alive, IP address), as the GCS sees it now (dead nodes included)."""
    import ray

    return {node["NodeID"]: (node["Alive"], node["NodeManagerAddress"]) for node in ray.nodes()}


class RayActors:
    """Makes a run's Ray actors, each in its bundle (an index into `spec.bundles()`) of the run's
    placement group, which creating this reserves (inside a Tune trial: takes the trial's, see
    `placement`). The other backend is `aa_ray.runtime.inline.InlineActors`."""

    def __init__(self, spec: ExperimentSpec, learning: bool = True):
        self.group, self.bundle_offset, self.owns_group = placement(spec, spec.bundles(learning))
        self.node_refs: dict[Any, Any] = {}  # actor -> ref of the id of the node it runs on (its own answer)
        self.bundles: dict[Any, int] = {}  # actor -> its bundle
        # one `ray.remote` class per plain class: Ray exports a new one to the cluster at its first start
        # (25-50 ms of the driver's CPU, each time), a kept one once (benchmarks/RESULTS.md section 39)
        self.remote_classes: dict[type, Any] = {}

    def start(self, cls: type, *args: Any, bundle: int, num_cpus: float, num_gpus: float = 0.0,
              torch_threads: int | None = None, **kwargs: Any) -> Any:
        """`ray.remote(cls)` started in its bundle with `cls(*args, **kwargs)`: the actor's handle.
        `torch_threads`: the torch thread count of the actor's process (its own, so the shell sets it
        there; the plain classes set no process-wide state). Ray runs an actor's calls in the order they
        were submitted, so it holds from the first call after the constructor on."""
        import ray

        options = {"num_cpus": num_cpus, "num_gpus": num_gpus, "scheduling_strategy": self._bundle(bundle)}
        if cls not in self.remote_classes:
            self.remote_classes[cls] = ray.remote(cls)
        actor = self.remote_classes[cls].options(**options).remote(*args, **kwargs)
        if torch_threads is not None:
            actor.__ray_call__.remote(_set_torch_threads, torch_threads)
        self.node_refs[actor] = actor.__ray_call__.remote(_node_id)  # where it is, asked while it lives
        self.bundles[actor] = bundle
        return actor

    def _bundle(self, index: int) -> PlacementGroupSchedulingStrategy:
        return in_bundle(self.group, self.bundle_offset + index)  # a Tune trial's own bundle 0 is the trial's

    def node_ip(self, bundle: int) -> str:
        """The address of the node that holds `bundle` (several learners rendezvous on learner 0's)."""
        return bundle_node_ip(self.group, self.bundle_offset + bundle)

    def kill(self, actor: Any) -> None:
        import ray

        ray.kill(actor)
        self.node_refs.pop(actor, None)
        self.bundles.pop(actor, None)

    def wait_briefly(self, refs: list[Any], timeout_s: float) -> None:
        """Wait up to `timeout_s` for calls whose results (or failures) do not matter."""
        import ray

        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)

    def _node_of(self, actor: Any) -> str | None:
        """The id of the node `actor` runs (or ran) on, as it said itself; if it never said (it died
        first), the node its bundle is on now; None if neither is known."""
        import ray
        from ray.util.placement_group import placement_group_table

        ref = self.node_refs.get(actor)
        if ref is not None and ray.wait([ref], timeout=0)[0]:
            try:
                return ray.get(ref)
            except ray.exceptions.RayError:
                pass
        if actor not in self.bundles:
            return None
        return placement_group_table(self.group)["bundles_to_node_id"].get(self.bundle_offset + self.bundles[actor])

    def lost_nodes(self, gone: list[Any], named: list[tuple[str, Any]]) -> list[NodeLoss]:
        """The nodes lost with these gone actors, each naming the actors of `named` it held. An actor on
        a node whose raylet ended is at first only unavailable (Ray cannot reach it and has not yet
        declared it dead); this waits for the verdict (up to `NODE_VERDICT_S`): the GCS declares its
        node dead, or the actor dead on a live node (a process killed alone), or it answers again."""
        import ray

        homes = {actor: self._node_of(actor) for actor in gone}
        deadline = time.monotonic() + NODE_VERDICT_S
        while True:
            nodes = _nodes()
            undecided = [actor for actor, node in homes.items() if nodes.get(node, (False, ""))[0]]
            if not undecided:
                break
            pings = [actor.__ray_ready__.remote() for actor in undecided]
            answered, unanswered = ray.wait(pings, num_returns=len(pings), timeout=2)
            waiting = len(unanswered)  # a call to an actor on a node that just died may hang for a while
            for ref in answered:
                try:
                    ray.get(ref)
                except ray.exceptions.ActorUnavailableError:
                    waiting += 1
                except ray.exceptions.RayActorError:
                    pass  # declared dead while its node lives: it alone died
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        nodes = _nodes()
        lost = {node for node in homes.values() if node is not None and not nodes.get(node, (True, ""))[0]}
        where = {name: self._node_of(actor) for name, actor in named}
        return [NodeLoss(node, nodes[node][1], [name for name, home in where.items() if home == node])
                for node in sorted(lost)]

    def await_placement(self, timeout_s: float) -> None:
        """Wait until Ray has re-placed the bundles of lost nodes: the run's placement group is whole
        again, every bundle on a live node. ResourceError if the surviving nodes cannot hold them."""
        import ray
        from ray.util.placement_group import placement_group_table

        deadline = time.monotonic() + timeout_s
        while True:
            table = placement_group_table(self.group)
            nodes = _nodes()
            homeless = [index for index in range(len(self.group.bundle_specs))
                        if not nodes.get(table["bundles_to_node_id"].get(index), (False, ""))[0]]
            if table["state"] == "CREATED" and not homeless:
                return
            if time.monotonic() > deadline:
                raise ResourceError(
                    f"a node was lost and the surviving nodes could not take its bundles {homeless} of the run's "
                    f"placement group within runtime.resource_timeout_s={timeout_s:g}s (available now: "
                    f"{ray.available_resources()}); add a node, or resume from the last checkpoint"
                )
            time.sleep(0.2)

    def dead(self, named: list[tuple[str, Any]]) -> list[str]:
        """The names of the (name, actor) pairs whose actor is gone (a busy one, e.g. a learner
        waiting on a dead peer's collective, does not answer within the timeout and is not counted)."""
        import ray

        pings = {actor.__ray_ready__.remote(): name for name, actor in named}
        answered, _ = ray.wait(list(pings), num_returns=len(pings), timeout=10)
        dead = []
        for ref in answered:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                dead.append(pings[ref])
        return sorted(dead, key=[name for name, _ in named].index)

    def close(self) -> None:
        """Give back the placement group, if this run reserved it."""
        if self.owns_group:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
