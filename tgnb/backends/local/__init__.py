"""The local engine: runs on the emulated nodes of a cluster served by the local emulator.

A package like `tgnb.backends.slurm` and `tgnb.backends.kubernetes`: `backend` (the `Backend`
protocol over the run store), `supervisor` (one detached process per run, the node's kubelet or
slurmd), `nodes` (the emulator's node list as the supervisor reads it), `warm` (the training stack
imported once, a single-node run forked from it) and `proctree` (a run's whole process tree).
"""

from tgnb.backends.local.backend import LocalBackend, emulator_endpoint, supervisor_alive

__all__ = ["LocalBackend", "emulator_endpoint", "supervisor_alive"]
