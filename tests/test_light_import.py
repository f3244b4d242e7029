"""`import tgnb` and the notebook side must stay light: no torch, TRL, transformers or kubernetes,
nor the trackers (wandb, mlflow: imported only by a run whose ``report_to`` names them)."""

from tests.conftest import heavy_in, modules_after


def test_import_tgnb_is_light() -> None:
    loaded = modules_after(
        "import tgnb, tgnb.cli, tgnb.events, tgnb.backends, tgnb.train, tgnb.cloud, "
        "tgnb.train.tracker"
    )
    heavy = heavy_in(loaded)
    assert heavy == [], f"heavy modules imported: {heavy[:10]}"
