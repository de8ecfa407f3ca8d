"""Algorithms, one file per variant; `aa_ray.algos.registry` lists them."""
