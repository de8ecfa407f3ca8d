"""The algorithm registry. `ALGORITHMS` lists aa-ray's own algorithms: the spec's `algo` union,
the learner and the env runners all look an algorithm up here (`registered`).

A user's own algorithm is a plugin: a module of theirs that defines
`ALGORITHM = Registered(config, algorithm, make_policy)`, named in the spec (`algo.plugin:
mypkg.my_algo`) or by an installed package's entry point in the group `aa_ray.algorithms`
(`my_algo = "mypkg.my_algo"`), whose name is then enough (`algo.name: my_algo`). Its config builds
on `OffPolicyKnobs` or `OnPolicyKnobs`, which choose its family and so how the runtime feeds it.
Every process that builds it (learners, env runners) imports the module from `algo.plugin`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any, NamedTuple

from torch import nn

from aa_ray.algos import crossq, droq, fast_sac, fast_td3, ppo, sac, sac_dist, sac_dist_simba, sac_simba, td3
from aa_ray.algos.config import OffPolicyKnobs, OnPolicyKnobs
from aa_ray.algos.contract import TrainingSetup
from aa_ray.errors import what_user_code_did
from aa_ray.records import ObsDims


class Registered(NamedTuple):
    config: type  # the pydantic config, discriminated by its `name` literal; its family mixin sets `family`
    algorithm: type  # built as algorithm(config, obs, act_dim, setup); obs: ObsDims, setup: TrainingSetup
    make_policy: Any  # (config, obs, act_dim) -> the acting module env runners load


ALGORITHMS: dict[str, Registered] = {
    "sac": Registered(sac.SACConfig, sac.SAC, sac.make_policy),
    "sac_simba": Registered(sac_simba.SACSimbaConfig, sac_simba.SACSimba, sac_simba.make_policy),
    "td3": Registered(td3.TD3Config, td3.TD3, td3.make_policy),
    "sac_dist": Registered(sac_dist.SACDistConfig, sac_dist.SACDist, sac_dist.make_policy),
    "sac_dist_simba": Registered(
        sac_dist_simba.SACDistSimbaConfig, sac_dist_simba.SACDistSimba, sac_dist_simba.make_policy
    ),
    "ppo": Registered(ppo.PPOConfig, ppo.PPO, ppo.make_policy),
    "crossq": Registered(crossq.CrossQConfig, crossq.CrossQ, crossq.make_policy),
    "droq": Registered(droq.DroQConfig, droq.DroQ, droq.make_policy),
    "fast_td3": Registered(fast_td3.FastTD3Config, fast_td3.FastTD3, fast_td3.make_policy),
    "fast_sac": Registered(fast_sac.FastSACConfig, fast_sac.FastSAC, fast_sac.make_policy),
}


PLUGIN_GROUP = "aa_ray.algorithms"
_plugins: dict[str, Registered] = {}  # name -> a plugin imported in this process (as sys.modules caches it)


def load_plugin(module: str) -> Registered:
    """The `ALGORITHM` a plugin module defines, checked. ValueError naming what to fix."""
    try:
        imported = importlib.import_module(module)
    except ImportError as err:
        raise ValueError(
            f"algo.plugin: cannot import {module!r} ({err}); install the package that holds it, or list its "
            "folder in env.py_modules so that every process of the run can import it"
        ) from None
    except (Exception, SystemExit) as err:  # the plugin's own code failed (or exited) while it was imported
        raise ValueError(f"algo.plugin: importing {module!r} {what_user_code_did(err)}; fix the error in it") from None
    entry = getattr(imported, "ALGORITHM", None)
    if not isinstance(entry, Registered):
        raise ValueError(
            f"algo.plugin: module {module} defines no ALGORITHM = aa_ray.algos.registry.Registered(config, "
            "algorithm, make_policy)"
        )
    name = entry.config.model_fields["name"].default if "name" in entry.config.model_fields else None
    if not isinstance(name, str) or not issubclass(entry.config, OffPolicyKnobs | OnPolicyKnobs):
        raise ValueError(
            f"algo.plugin: the config of {module}.ALGORITHM needs a `name` literal with a default and a family: "
            "build it on aa_ray.algos.config.OffPolicyKnobs or OnPolicyKnobs"
        )
    if name in ALGORITHMS:
        raise ValueError(f"algo.plugin: {module} names its algorithm {name!r}, which is aa-ray's own; rename it")
    _plugins[name] = entry
    return entry


def find_plugin(name: str, plugin: str | None) -> tuple[Registered, str]:
    """(the registration, its module) of a plugin algorithm `name`: from `algo.plugin`, or from an
    installed package's entry point. ValueError naming what to fix."""
    module = plugin or next((point.module for point in entry_points(group=PLUGIN_GROUP) if point.name == name), None)
    if module is None:
        raise ValueError(
            f"algo.name: unknown algorithm {name!r} (aa-ray's own: {', '.join(ALGORITHMS)}); for an algorithm "
            f"of your own, name the module that defines it in algo.plugin (or install a package that registers "
            f"{name!r} in the entry point group {PLUGIN_GROUP})"
        )
    entry = load_plugin(module)
    found = entry.config.model_fields["name"].default
    if found != name:
        raise ValueError(f"algo.plugin: {module} defines the algorithm {found!r}; set algo.name: {found}")
    return entry, module


def registered(cfg: Any) -> Registered:
    """The registration of a validated algo config, aa-ray's own or a plugin's."""
    return ALGORITHMS.get(cfg.name) or _plugins.get(cfg.name) or load_plugin(cfg.plugin)


def build_algorithm(cfg: Any, obs: ObsDims | int, act_dim: int, setup: TrainingSetup, **family_args: Any) -> Any:
    """`family_args`: what the algorithm's family adds (the on-policy family's `mirror`, with
    `algo.sym_aug`: an on-policy algorithm mirrors its own minibatches)."""
    return registered(cfg).algorithm(cfg, ObsDims.of(obs), act_dim, setup, **family_args)


def build_policy(cfg: Any, obs: ObsDims | int, act_dim: int) -> nn.Module:
    """The acting module, in evaluation mode: env runners, evaluation, rollouts and exported policies
    act with batch normalization's running statistics and without dropout (the learner trains its
    own copy in training mode)."""
    return registered(cfg).make_policy(cfg, ObsDims.of(obs), act_dim).eval()


# knobs renamed by the redesign (one naming scheme across variants): algo -> old name -> what to write now
_MLP_WIDTHS = {"hidden_dims": "actor_hidden_dims and critic_hidden_dims"}
_SIMBA_RATES = {
    "learning_rate": "actor_lr, critic_lr and alpha_lr",
    "learning_rate_end": "lr_end_fraction (= learning_rate_end / learning_rate)",
}
RENAMED_KNOBS: dict[str, dict[str, str]] = {
    "sac": _MLP_WIDTHS, "sac_dist": _MLP_WIDTHS, "td3": _MLP_WIDTHS,
    "ppo": {**_MLP_WIDTHS, "lr": "actor_lr and critic_lr"},
    "sac_simba": _SIMBA_RATES, "sac_dist_simba": _SIMBA_RATES,
}
_SIMBA_LEARNING_RATES = (1e-4, 5e-5)  # the old sac_simba / sac_dist_simba defaults (start, end)


def migrate_old_knobs(algo: dict[str, Any]) -> dict[str, Any]:
    """An algo section written before the knob redesign, with today's names (a copy; a section
    already in today's names comes back unchanged). Old checkpoints' specs pass through here."""
    new = dict(algo)
    if "hidden_dims" in new:
        dims = new.pop("hidden_dims")
        new.setdefault("actor_hidden_dims", list(dims))
        new.setdefault("critic_hidden_dims", list(dims))
    if "learning_rate" in new or "learning_rate_end" in new:
        start = new.pop("learning_rate", _SIMBA_LEARNING_RATES[0])
        end = new.pop("learning_rate_end", _SIMBA_LEARNING_RATES[1])
        for key in ("actor_lr", "critic_lr", "alpha_lr"):
            new.setdefault(key, start)
        new.setdefault("lr_end_fraction", round(end / start, 12))
    if new.get("name") == "ppo" and "lr" in new:
        lr = new.pop("lr")
        new.setdefault("actor_lr", lr)
        new.setdefault("critic_lr", lr)
    return new
