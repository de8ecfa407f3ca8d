"""A researcher's own algorithm package, outside aa_ray: `myalgos.fixed_alpha_sac` defines the
algorithm `fixed_alpha_sac` that specs name with `algo.plugin: myalgos.fixed_alpha_sac`."""
