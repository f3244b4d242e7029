"""`import tgnb` and the notebook side must stay light: no torch, TRL, transformers or kubernetes."""

from tests.conftest import heavy_in, modules_after


def test_import_tgnb_is_light() -> None:
    loaded = modules_after(
        "import tgnb, tgnb.cli, tgnb.events, tgnb.backends, tgnb.train, tgnb.cloud"
    )
    heavy = heavy_in(loaded)
    assert heavy == [], f"heavy modules imported: {heavy[:10]}"
