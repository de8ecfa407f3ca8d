"""The `aa-ray rollout` job: record a transition dataset with a checkpoint's policy or the env's
scripted controller, through the runtime's actor graph (`job.py`: the driver; `recorder.py`: what
each actor is).

It sits above the runtime (it drives an `ActorGraph`) and the dataset formats (`aa_ray.data`), which
sit below the runtime: the replay buffer and the trainer read datasets, and nothing under
`aa_ray.data` or `aa_ray.runtime` imports this package.
"""
