"""A synthetic workload for measuring aa-ray's runtime at scale (`benchmarks/bench_scale.py`): an
env whose step costs a set time and a learner whose update costs a set time, neither doing real
work, so that what is measured is the runtime (actors, replay, object store, driver) around them.

Both come in the way a user brings their own: the env package registers its id with gymnasium on
import, and `scale_sim.timed_learner` is an algorithm plugin (`algo.plugin`). The spec
`benchmarks/scale_sim.yaml` names both and ships this folder to every Ray worker (`env.py_modules`).
"""

import gymnasium as gym

ENV_ID = "scale_sim/Synthetic-v0"

if ENV_ID not in gym.registry:
    gym.register(id=ENV_ID, entry_point="scale_sim.env:SyntheticEnv", max_episode_steps=1000)
