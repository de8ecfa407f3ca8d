"""Pendulum with gravity NaN: every observation and reward after the first step is NaN, the way a
simulator that blew up behaves. A spec cannot ask for it with `env.kwargs: {g: .nan}` (aa-ray refuses
non-finite values anywhere in a spec), so the numerical-guard test names this creator instead."""

from gymnasium.envs.classic_control.pendulum import PendulumEnv


def nan_gravity_pendulum(**kwargs: object) -> PendulumEnv:
    return PendulumEnv(g=float("nan"), **kwargs)
