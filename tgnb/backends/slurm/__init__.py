"""The Slurm backend: sbatch scripts rendered from a `RunSpec`, submitted and followed with Slurm's
own commands, here or on a login node over SSH."""

from tgnb.backends.slurm.backend import SlurmBackend
from tgnb.backends.slurm.commands import CommandRunner
from tgnb.backends.slurm.records import job_status, parse_fields
from tgnb.backends.slurm.render import RenderOptions, render_config, render_script

__all__ = [
    "CommandRunner",
    "RenderOptions",
    "SlurmBackend",
    "job_status",
    "parse_fields",
    "render_config",
    "render_script",
]
