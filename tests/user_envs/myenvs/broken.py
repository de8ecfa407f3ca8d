"""A module whose import fails, as a user's half-written env module would."""

raise RuntimeError("this env module is half-written: the robot's URDF path is not set")
