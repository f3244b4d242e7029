"""``python -m tgnb.backends.slurm PLACER_JSON JOBID``: a run's placer job
(`tgnb.backends.slurm.placer`), as its rendered ``placer.sbatch`` runs it."""

import sys

from tgnb.backends.slurm.placer import main

sys.exit(main())
