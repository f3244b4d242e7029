"""``tgnb certify``: proof before spending. The user's own program runs on the local emulator
beside an uninterrupted copy of itself, under a chaos schedule (a preemption during setup, one
during its first save, one at a random step, a kill with no notice), and a `Certificate` says
what each event cost, whether the final parameters equal the uninterrupted run's, and what is
missing, with its fix. Modules: `core` (the two runs), `chaos` (the events), `state` (the final
parameters, read with ``torch.distributed.checkpoint``), `report` (the certificate); for a
fault-tolerant program (``fault_tolerance="torchft"``, replica groups), `groupchaos` (the events,
one group at a time) and `groups` (the checks made instead of comparing parameters). The
``tgnb certify`` command, which attaches a session of its own, is `tgnb.certify_cli`."""

from tgnb.certify.core import certify
from tgnb.certify.report import Certificate, Finding

__all__ = ["Certificate", "Finding", "certify"]
