"""The spec fields whose values have always been part of a spec's hash (`loader.spec_hash`), frozen
as they were when the hashes of finished suite cells, reusable pipeline stages and run names were
first written. Never edit it: a field that is not here (any knob added since, a section of its own
or a newer algorithm's) counts toward the hash only when it is set to something other than its
default, so nobody has to list a new knob to keep the hashes of specs that leave it alone."""

from __future__ import annotations

SECTIONS: dict[str, frozenset[str]] = {
    "env": frozenset({"id", "kwargs", "max_episode_steps"}),
    "budget": frozenset({"env_steps", "stop_at_eval_distance", "stop_at_eval_return"}),
    "runners": frozenset({"cpus_per_runner", "envs_per_runner", "num_runners", "torch_threads"}),
    "learners": frozenset({
        "backend", "collective_timeout_s", "compile", "cpus_per_learner", "gpus_per_learner", "matmul_precision",
        "num_learners", "torch_threads"
    }),
    "eval": frozenset({"episodes", "every_env_steps", "video", "video_max_frames"}),
    "checkpoint": frozenset({"every_env_steps", "save_replay"}),
    "tracking": frozenset({"enabled", "experiment", "flush_every_s"}),
    "runtime": frozenset({
        "backend", "max_consecutive_skips", "max_learner_restarts", "max_policy_lag", "max_runner_restarts", "mode",
        "output_dir", "q_warning_bound", "replay_cpus", "resource_timeout_s"
    }),
}

ALGORITHMS: dict[str, frozenset[str]] = {  # algo.name -> its config's fields then
    "sac": frozenset({
        "actor_hidden_dims", "actor_lr", "alpha_lr", "autotune_alpha", "batch_size", "bee_lambda", "buffer_size",
        "critic_hidden_dims", "critic_loss", "critic_lr", "gamma", "huber_delta", "init_alpha", "layer_norm",
        "learn_v", "lr_end_fraction", "max_grad_norm", "n_step", "name", "normalize_obs", "normalize_reward",
        "optimizer", "precision", "prior_data", "prior_data_ratio", "target_entropy", "target_entropy_per_dim",
        "tau", "train_every", "utd_ratio", "v_quantile", "warm_up_steps"
    }),
    "sac_simba": frozenset({
        "actor_hidden_dim", "actor_lr", "actor_num_blocks", "alpha_lr", "autotune_alpha", "batch_size",
        "bee_lambda", "buffer_size", "critic_hidden_dim", "critic_loss", "critic_lr", "critic_num_blocks", "gamma",
        "huber_delta", "init_alpha", "learn_v", "lr_end_fraction", "max_grad_norm", "n_step", "name",
        "normalize_obs", "normalize_reward", "optimizer", "precision", "prior_data", "prior_data_ratio",
        "target_entropy", "target_entropy_per_dim", "tau", "train_every", "utd_ratio", "v_quantile", "warm_up_steps"
    }),
    "td3": frozenset({
        "actor_hidden_dims", "actor_lr", "batch_size", "buffer_size", "critic_hidden_dims", "critic_loss",
        "critic_lr", "exploration_noise", "gamma", "huber_delta", "layer_norm", "lr_end_fraction", "max_grad_norm",
        "n_step", "name", "normalize_obs", "normalize_reward", "optimizer", "policy_delay", "precision",
        "prior_data", "prior_data_ratio", "target_noise", "target_noise_clip", "tau", "train_every", "utd_ratio",
        "warm_up_steps"
    }),
    "sac_dist": frozenset({
        "actor_hidden_dims", "actor_lr", "alpha_lr", "autotune_alpha", "batch_size", "buffer_size",
        "critic_hidden_dims", "critic_loss", "critic_lr", "gamma", "huber_delta", "init_alpha", "layer_norm",
        "lr_end_fraction", "max_grad_norm", "n_step", "name", "normalize_obs", "normalize_reward", "num_atoms",
        "optimizer", "precision", "prior_data", "prior_data_ratio", "target_entropy", "target_entropy_per_dim",
        "tau", "train_every", "utd_ratio", "v_max", "v_min", "warm_up_steps"
    }),
    "sac_dist_simba": frozenset({
        "actor_hidden_dim", "actor_lr", "actor_num_blocks", "alpha_lr", "autotune_alpha", "batch_size",
        "buffer_size", "critic_hidden_dim", "critic_loss", "critic_lr", "critic_num_blocks", "gamma", "huber_delta",
        "init_alpha", "lr_end_fraction", "max_grad_norm", "n_step", "name", "normalize_obs", "normalize_reward",
        "num_atoms", "optimizer", "precision", "prior_data", "prior_data_ratio", "target_entropy",
        "target_entropy_per_dim", "tau", "train_every", "utd_ratio", "v_max", "v_min", "warm_up_steps"
    }),
    "ppo": frozenset({
        "actor_hidden_dims", "actor_lr", "clip_param", "critic_hidden_dims", "critic_lr", "desired_kl",
        "entropy_coef", "gae_lambda", "gamma", "init_log_std", "lr_bounds", "lr_end_fraction", "max_grad_norm",
        "name", "normalize_obs", "normalize_reward", "num_minibatches", "ppo_epochs", "spo", "train_every",
        "value_coef"
    }),
}
