"""A user's own env package, as a researcher would write one: it registers its envs with gymnasium
when imported. It lives outside aa_ray and is importable only by path (the tests name the folder in
`env.py_modules`, or ship it with `ray job submit --working-dir`)."""

import gymnasium as gym

if "myenvs/PointReach-v0" not in gym.registry:
    gym.register(id="myenvs/PointReach-v0", entry_point="myenvs.point:PointReachEnv", max_episode_steps=40)
