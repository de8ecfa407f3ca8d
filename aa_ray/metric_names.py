"""Metric names that code reads back (the driver, Tune, reports, the progress line). Algorithms
log more diagnostics under the same `section/name` scheme (`critic/q_loss`, `actor/alpha`, ...);
only the names something depends on live here."""

import re

# task metrics from the env's info (aa_ray/envs/info_metrics.py): an info key, which becomes eval/<key>
# and train/<key>, is a simple identifier, and none may take the name of a metric the runtime makes itself
INFO_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
RESERVED_INFO_KEYS = ("return", "length", "success", "at_env_steps", "episode_return")
# a task's reward terms (EnvPool's robot tasks report each in info["reward_<term>"] every step): each
# episode's sum of a term becomes eval/reward/<term> and train/reward/<term>, Playground's and Isaac
# Lab's per-episode reward-term logs
REWARD_TERM = "reward/"

# counters and throughput (the driver)
ENV_STEPS = "env/steps"  # Tune's and the reports' time axis
ENV_EPISODES = "env/episodes"
ENV_STEPS_PER_S = "env/steps_per_s"
TRAIN_EPISODE_RETURN = "train/episode_return"
TRAIN_SUCCESS = "train/success"  # info["is_success"] of the recent training episodes, where the env reports it
TRAIN_PREFIX = "train/"  # + a task metric (aa_ray/envs/info_metrics.py): the recent training episodes' mean
RUN_FINISHED = "run/finished"
RUN_RESUMED_AT = "run/resumed_at"  # a resume's checkpoint env steps, logged at that step (see report.py)

# evaluation (env runners)
EVAL_RETURN = "eval/return"
EVAL_LENGTH = "eval/length"
EVAL_SUCCESS = "eval/success"  # info["is_success"] at the eval episodes' last step, where the env reports it
EVAL_PREFIX = "eval/"  # + a task metric (aa_ray/envs/info_metrics.py): its mean over the eval episodes
EVAL_AT_ENV_STEPS = "eval/at_env_steps"

# replay
REPLAY_SIZE = "replay/size"
REPLAY_FILL = "replay/fill"
REPLAY_PRIOR_SIZE = "replay/prior_size"

# learner (the learner and the driver's health checks)
LEARNER_UPDATE_TIME_S = "learner/update_time_s"
LEARNER_UPDATES_PER_S = "learner/updates_per_s"
LEARNER_GRADIENT_UPDATES = "learner/gradient_updates"
LEARNER_SKIPPED_UPDATES = "learner/skipped_updates"
LEARNER_CONSECUTIVE_SKIPS = "learner/consecutive_skips"
LEARNER_COMPILED = "learner/compiled"  # 1 while the update runs compiled (learners.compile)
LEARNER_BF16 = "learner/bf16"  # 1 while the update's autocast runs bf16 (algo.precision bf16, or auto resolved so)
LEARNER_LARGEST_VALUE = "learner/largest_value"  # largest |Q| (or |V|) of the last update
LEARNER_Q_EXPLODING = "learner/q_exploding"

# where the time goes (runtime/phases.py): each phase's seconds in an iteration, logged as time/<phase>_s
PHASE_COLLECT = "collect"  # env runners stepping their envs (the slowest runner)
PHASE_REPLAY_SAMPLE = "replay_sample"  # the replay actor drawing the learners' batches
PHASE_TRANSFER = "transfer"  # from the replay's sample to the learner starting on it (transfer and queueing)
PHASE_LEARNER_UPDATE = "learner_update"
PHASE_PUBLISH = "publish"  # env runners loading new policy weights
PHASE_EVAL = "eval"
PHASE_CHECKPOINT = "checkpoint"
PHASE_TRACKING = "tracking"  # logging to MLflow
PHASES = (PHASE_COLLECT, PHASE_REPLAY_SAMPLE, PHASE_TRANSFER, PHASE_LEARNER_UPDATE, PHASE_PUBLISH, PHASE_EVAL,
          PHASE_CHECKPOINT, PHASE_TRACKING)

# runtime (async mode and fault recovery)
RUNTIME_POLICY_LAG_MEAN = "runtime/policy_lag_mean"
RUNTIME_POLICY_LAG_MAX = "runtime/policy_lag_max"
RUNTIME_POLICY_VERSION = "runtime/policy_version"
RUNTIME_UPDATES_PER_FLEET_STEP = "runtime/updates_per_fleet_step"
RUNTIME_RUNNER_RESTARTS = "runtime/runner_restarts"
RUNTIME_GRAPH_RESTARTS = "runtime/graph_restarts"

# algorithm diagnostics the progress line shows (each algorithm logs the ones it has)
CRITIC_Q_LOSS = "critic/q_loss"
CRITIC_Q_VALUE = "critic/q_value"
CRITIC_Q_MAX = "critic/q_max"
ACTOR_LOSS = "actor/loss"
ACTOR_ALPHA = "actor/alpha"
ACTOR_ENTROPY = "actor/entropy"
ACTOR_LR = "actor/lr"  # the actor's learning rate now (schedules, PPO's KL rule)

# RLPD: every off-policy algorithm trained with algo.prior_data logs these
CRITIC_PRIOR_Q = "critic/prior_q"
CRITIC_ONLINE_Q = "critic/online_q"
CRITIC_PRIOR_ONLINE_Q_GAP = "critic/prior_online_q_gap"
RLPD_DIAGNOSTICS = (CRITIC_PRIOR_Q, CRITIC_ONLINE_Q, CRITIC_PRIOR_ONLINE_Q_GAP)
