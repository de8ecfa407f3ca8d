"""Config pieces that several algorithms share, as pydantic mixins composed into each variant's
config. The YAML stays flat (`algo.bee_lambda`, `algo.utd_ratio`): a mixin only groups fields and
the checks between them. A variant's config lists its mixins and then only its own fields (or a
different default for a shared one).

One naming scheme across variants: `actor_lr`, `critic_lr` (critic and V), `alpha_lr` (SAC), each
decayed linearly to `lr_end_fraction` of its start over the planned updates; `actor_hidden_dims`,
`critic_hidden_dims` for MLPs; SimbaV2 keeps its paper's `*_hidden_dim` / `*_num_blocks`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from aa_ray.algos.contract import RunShape
from aa_ray.spec.base import SpecModel

FamilyName = Literal["off_policy", "on_policy"]  # the runtime's families (`aa_ray.runtime.families.FAMILIES`)


class ObservationGroups(SpecModel):
    """Which keys of a Dict observation the actor and the critic read (aa_ray/envs/obs_groups.py)."""

    actor_obs: list[str] | None = Field(
        None,
        description="Dict observations: the keys the actor (the deployed policy) reads, e.g. [proprio, command]; "
        "null = every key, or [state] for observations of state and privileged_state (MuJoCo Playground's and "
        "EnvPool's robot tasks; UniLab's obs and critic likewise). Leave out for a flat Box env",
    )
    critic_obs: list[str] | None = Field(
        None,
        description="Dict observations: the keys the critic reads, the actor's and more (privileged state, e.g. "
        "[proprio, command, privileged]); null = the actor's keys (with actor_obs null too: both of the "
        "state / privileged_state pair)",
    )


class AlgorithmSource(SpecModel):
    """Where a plugin algorithm comes from (aa_ray.algos.registry); empty for aa-ray's own."""

    plugin: str | None = Field(
        None,
        description="your own algorithm: the module that defines ALGORITHM = aa_ray.algos.registry.Registered(...), "
        "e.g. mypkg.my_algo (its folder in env.py_modules, or installed); null for aa-ray's own algorithms",
    )


class OffPolicyKnobs(ObservationGroups, AlgorithmSource):
    """Replay, the TD regression, and how a gradient step is taken: every off-policy variant. A config
    with these knobs belongs to the off-policy family (`aa_ray.runtime.families.OffPolicy`)."""

    family: ClassVar[FamilyName] = "off_policy"
    replay_actor: ClassVar[bool] = True  # a replay actor sits between the runners and the learners

    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    n_step: PositiveInt = Field(1, description="n-step returns (1 = one-step TD)")
    tau: float = Field(0.005, gt=0, le=1, description="polyak rate of the target networks")
    batch_size: PositiveInt = Field(256, description="transitions per gradient step")
    buffer_size: PositiveInt = Field(1_000_000, description="replay capacity in transitions")
    warm_up_steps: NonNegativeInt = Field(5000, description="uniform random actions until this many are stored")
    train_every: PositiveInt = Field(32, description="fleet steps collected between learner iterations")
    utd_ratio: PositiveInt = Field(1, description="critic updates per fleet step")
    normalize_obs: bool = Field(False, description="running mean/std observation normalization")
    normalize_reward: bool = Field(False, description="scale rewards by the running std of the return")
    critic_loss: Literal["mse", "huber"] = Field("mse", description="TD regression loss (scalar critics)")
    huber_delta: PositiveFloat = Field(1.0, description="Huber threshold when critic_loss is huber")
    max_grad_norm: PositiveFloat | None = Field(None, description="clip gradients to this global norm")
    precision: Literal["fp32", "bf16", "fp16", "auto"] = Field(
        "fp32",
        description="autocast dtype (losses in fp32); auto = bf16 where the learner's device has it natively (a CPU "
        "with avx512_bf16 or amx_bf16, a CUDA GPU of compute capability 8.0 or later), else fp32",
    )
    optimizer: Literal["adam", "muon"] = Field("adam", description="muon: Muon for hidden matrices, AdamW else")
    sym_aug: bool = Field(
        False,
        description="symmetry augmentation: every batch doubled with its mirror image (obs, action, next_obs "
        "mirrored, aa_ray/envs/symmetry.py) for the critic and actor updates; the env must have a mirror",
    )

    @model_validator(mode="after")
    def _muon_available(self) -> OffPolicyKnobs:
        if self.optimizer == "muon" and not hasattr(torch.optim, "Muon"):
            raise ValueError(
                f"optimizer: muon needs torch.optim.Muon, which torch {torch.__version__} lacks; "
                "use optimizer: adam or a newer torch"
            )
        if self.optimizer == "muon" and self.precision == "fp16":
            raise ValueError("optimizer: muon cannot be combined with precision fp16 (loss scaling); use bf16")
        return self

    @property
    def updates_per_iteration(self) -> int:
        """Replay batches one learner iteration trains on: `train_every` fleet steps of `utd_ratio`
        batches each (the update-to-data ratio)."""
        return self.train_every * self.utd_ratio

    def check_run(self, run: RunShape) -> None:
        """What these knobs need of the rest of the spec (ValueError naming the fields)."""
        if self.warm_up_steps >= run.env_steps:
            raise ValueError(
                f"algo.warm_up_steps ({self.warm_up_steps}) must be below budget.env_steps "
                f"({run.env_steps}), or training never starts"
            )
        if self.batch_size % run.num_learners:
            raise ValueError(
                f"algo.batch_size ({self.batch_size}) must be divisible by learners.num_learners "
                f"({run.num_learners}): each learner trains on an equal shard of the batch"
            )
        if self.batch_size > self.buffer_size:
            raise ValueError(f"algo.batch_size ({self.batch_size}) exceeds algo.buffer_size ({self.buffer_size})")


class OnPolicyKnobs(ObservationGroups, AlgorithmSource):
    """Fresh rollouts, no replay: every on-policy variant. A config with these knobs belongs to the
    on-policy family (`aa_ray.runtime.families.OnPolicy`); the variant adds `updates_per_iteration`
    (gradient steps on one rollout) and may add checks to `check_run`."""

    family: ClassVar[FamilyName] = "on_policy"
    replay_actor: ClassVar[bool] = False

    gamma: float = Field(0.99, gt=0, le=1, description="discount factor")
    train_every: PositiveInt = Field(32, description="rollout steps per env between updates")
    sym_aug: bool = Field(
        False,
        description="symmetry augmentation: the algorithm doubles its minibatches with their mirror images "
        "(aa_ray/envs/symmetry.py); the env must have a mirror",
    )

    # what the runtime reads of every family's config, fixed for this one
    @property
    def n_step(self) -> int:
        """Runners record one-step rows; the algorithm computes its own multi-step returns (GAE)."""
        return 1

    @property
    def precision(self) -> str:
        """On-policy updates run in fp32."""
        return "fp32"

    def check_run(self, run: RunShape) -> None:
        if run.fleet_envs % run.num_learners:
            raise ValueError(
                f"runners.num_runners x runners.envs_per_runner ({run.fleet_envs}) must be divisible by "
                f"learners.num_learners ({run.num_learners}): each learner trains on an equal share of the envs"
            )
        if run.mode == "async":
            raise ValueError(f"runtime.mode async needs an off-policy algorithm; {self.name} learns on-policy")

    def rollout_rows_per_learner(self, run: RunShape) -> int:
        return self.train_every * run.fleet_envs // run.num_learners


class LearningRates(SpecModel):
    """Every variant's optimizer rates and their linear schedule over the run's planned updates."""

    actor_lr: PositiveFloat = Field(3e-4, description="actor learning rate")
    critic_lr: PositiveFloat = Field(1e-3, description="critic (and V) learning rate")
    lr_end_fraction: float = Field(
        1.0, gt=0, le=1, description="each lr after the planned updates, as a fraction of its start (1 = constant)"
    )


class TemperatureKnobs(SpecModel):
    """SAC's entropy temperature alpha, learned toward a target entropy."""

    alpha_lr: PositiveFloat = Field(1e-3, description="temperature learning rate")
    init_alpha: PositiveFloat = Field(1.0, description="initial temperature")
    autotune_alpha: bool = Field(True, description="learn the temperature toward the target entropy")
    target_entropy_per_dim: float = Field(-1.0, description="target entropy = this x |A| (unless target_entropy)")
    target_entropy: float | None = Field(None, description="absolute target entropy (null = per_dim x |A|)")

    def target_entropy_for(self, act_dim: int) -> float:
        return self.target_entropy_per_dim * act_dim if self.target_entropy is None else self.target_entropy


class BEEKnobs(SpecModel):
    """BAC (Ji et al. 2024): an expectile V of replayed actions, mixed into the target by BEE."""

    learn_v: bool = Field(False, description="BAC: learn V(s) by expectile regression on replayed actions")
    v_quantile: float = Field(0.7, gt=0, lt=1, description="BAC: expectile of V (> 0.5 is optimistic)")
    bee_lambda: float = Field(0.0, ge=0, le=1, description="BEE: weight of the exploitation target (0 = SAC)")

    @model_validator(mode="after")
    def _bee_needs_v(self) -> BEEKnobs:
        if self.bee_lambda > 0 and not self.learn_v:
            raise ValueError("bee_lambda > 0 needs learn_v: true (the exploitation target bootstraps from V)")
        return self


class C51Support(SpecModel):
    """The categorical critics' fixed support (C51), composed with `OffPolicyKnobs` (its
    `normalize_reward` and `critic_loss` are checked against the support)."""

    num_atoms: int = Field(101, ge=2, description="atoms of the categorical support")
    v_min: float = Field(-20.0, description="lowest atom (soft return, in reward units after any scaling)")
    v_max: float = Field(20.0, description="highest atom; +-20 holds soft returns of |r| <~ 0.2 at gamma 0.99")

    @model_validator(mode="after")
    def _support_consistent(self) -> C51Support:
        if not self.v_min < self.v_max:
            raise ValueError(f"v_min must be below v_max (got {self.v_min} and {self.v_max})")
        scaled = isinstance(self, OffPolicyKnobs) and self.normalize_reward
        if scaled and not self.v_min < 0 < self.v_max:
            raise ValueError("normalize_reward scales returns to fit the support: it needs v_min < 0 < v_max")
        if isinstance(self, OffPolicyKnobs) and self.critic_loss != "mse":
            raise ValueError("critic_loss applies to scalar critics; the categorical critics use cross-entropy")
        return self

    def support_half_width(self) -> float:
        """Scaled returns of either sign fit the support when max|G| maps to its nearer end (SimbaV2: 5)."""
        return min(-self.v_min, self.v_max)


class RLPDKnobs(SpecModel):
    """RLPD (Ball et al. 2023): a prior dataset mixed into every batch; its rows come first."""

    prior_data: str | None = Field(
        None, description="RLPD: a transition dataset to mix in: a Parquet file or folder, a Minari dataset "
        "folder, or a Minari dataset id under MINARI_DATASETS_PATH",
    )
    prior_data_ratio: float = Field(0.5, ge=0, lt=1, description="RLPD: share of each batch from prior_data")


class MLPNetworks(SpecModel):
    """ReLU MLP actor and ensemble critics."""

    actor_hidden_dims: list[PositiveInt] = Field([256, 256], min_length=1, description="actor MLP widths")
    critic_hidden_dims: list[PositiveInt] = Field([256, 256], min_length=1, description="critic (and V) MLP widths")
    layer_norm: bool = Field(False, description="LayerNorm in the critics (as RLPD recommends with prior_data)")


class SimbaV2Networks(SpecModel):
    """SimbaV2's hyperspherical residual networks, with the paper's names and default sizes."""

    actor_hidden_dim: PositiveInt = Field(128, description="actor width")
    actor_num_blocks: PositiveInt = Field(1, description="actor residual blocks")
    critic_hidden_dim: PositiveInt = Field(512, description="critic width")
    critic_num_blocks: PositiveInt = Field(2, description="critic residual blocks")


class SimbaV2Recipe(SpecModel):
    """SimbaV2's defaults for the shared knobs (list it first so its defaults win): observation
    normalization, every lr 1e-4 decayed to 5e-5, initial temperature 0.01, target entropy -|A|/2."""

    normalize_obs: bool = Field(True, description="running mean/std observation normalization")
    actor_lr: PositiveFloat = Field(1e-4, description="actor learning rate")
    critic_lr: PositiveFloat = Field(1e-4, description="critic (and V) learning rate")
    alpha_lr: PositiveFloat = Field(1e-4, description="temperature learning rate")
    lr_end_fraction: float = Field(0.5, gt=0, le=1, description="each lr after the planned updates, x its start")
    init_alpha: PositiveFloat = Field(0.01, description="initial temperature")
    target_entropy_per_dim: float = Field(-0.5, description="target entropy = this x |A| (unless target_entropy)")
