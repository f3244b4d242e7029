"""``import tgnb.cloud`` stays light: the SDK is imported on first use, heavy libraries never."""

from __future__ import annotations

from tests.conftest import heavy_in, modules_after


def test_import_tgnb_cloud_is_light() -> None:
    assert heavy_in(modules_after("import tgnb.cloud"), also=["together"]) == []
