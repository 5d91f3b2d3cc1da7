"""Multi-turn environments: the episodes a trajectory talks to (base.py), three ways in."""
