"""Experiment specs: pydantic models (`experiment`), YAML loading, overrides and hashing (`loader`).

Import from the submodules; this package imports nothing eagerly because algorithm files
import `aa_ray.spec.base` and the experiment model imports the algorithm files.
"""
