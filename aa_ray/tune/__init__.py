"""Ray Tune: sweeps over spec keys and multi-stage pipelines, each trial a whole actor graph."""
