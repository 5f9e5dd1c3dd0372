"""Helpers for the launcher tests: rank programs, a one-node SLURM cluster, runners."""
