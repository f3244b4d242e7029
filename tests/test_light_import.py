"""`import tgnb` and the notebook side must stay light: no torch, TRL, transformers or kubernetes,
nor the trackers (wandb, mlflow: imported only by a run whose ``report_to`` names them)."""

import subprocess
import sys

HEAVY = (
    "torch",
    "trl",
    "transformers",
    "kubernetes",
    "datasets",
    "accelerate",
    "peft",
    "wandb",
    "mlflow",
)


def _modules_after(code: str) -> set[str]:
    probe = f"{code}\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    import json

    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_import_tgnb_is_light() -> None:
    loaded = _modules_after(
        "import tgnb, tgnb.cli, tgnb.events, tgnb.backends, tgnb.train, tgnb.cloud, "
        "tgnb.train.tracker"
    )
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == [], f"heavy modules imported: {heavy[:10]}"
