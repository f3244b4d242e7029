"""Clusters fidelity (issue 23 §4): add-ons on update, volume ids that exist, the storage routes.

The official SDK against a real emulator daemon: ``clusters.update(add_ons=...)`` applies them;
``clusters.create(volume_id=...)`` must name an existing volume (before: any id "worked" and a 1 TiB
volume was invented); ``clusters.storage.create/retrieve/list/update/delete`` are served with the
SDK's shapes, and a volume attached to a cluster cannot be deleted (as the SDK's docstring says).
"""

from __future__ import annotations

import pytest
import together

from .conftest import create


def test_update_add_ons_applies_them(sdk: together.Together) -> None:
    c = create(sdk)
    assert c.add_ons in ([], None)
    sdk.clusters.update(c.cluster_id, add_ons=[{"name": "traefik", "config": {"replicas": 2}}])
    got = sdk.clusters.retrieve(c.cluster_id)
    assert [a.name for a in got.add_ons] == ["traefik"]
    assert got.add_ons[0].model_dump()["config"]["replicas"] == 2
    sdk.clusters.update(c.cluster_id, add_ons=[])
    assert sdk.clusters.retrieve(c.cluster_id).add_ons == []
    with pytest.raises(together.BadRequestError, match="add_ons"):
        sdk.clusters.update(c.cluster_id, add_ons=[{"config": "x"}])  # type: ignore[list-item]


def test_unknown_volume_id_is_refused_and_nothing_created(sdk: together.Together) -> None:
    before = len(sdk.clusters.list().clusters)
    with pytest.raises(together.BadRequestError, match="volume_id"):
        create(sdk, volume_id="vol-does-not-exist")
    assert len(sdk.clusters.list().clusters) == before


def test_storage_routes_and_attached_volumes(sdk: together.Together) -> None:
    st = sdk.clusters.storage
    vol = st.create(region="us-central-2", size_tib=2, volume_name="data")
    assert vol.status == "available" and vol.size_tib == 2 and vol.volume_name == "data"
    assert st.retrieve(vol.volume_id).volume_id == vol.volume_id
    assert vol.volume_id in [v.volume_id for v in st.list().volumes]
    assert st.update(volume_id=vol.volume_id, size_tib=3).size_tib == 3
    with pytest.raises(together.BadRequestError, match="size_tib"):
        st.update(volume_id=vol.volume_id, size_tib=1)  # shrinking would lose data
    with pytest.raises(together.BadRequestError, match="region"):
        st.create(region="nowhere", size_tib=1, volume_name="x")

    c = create(sdk, volume_id=vol.volume_id)
    shown = sdk.clusters.retrieve(c.cluster_id).volumes
    assert [(v.volume_id, v.size_tib) for v in shown] == [(vol.volume_id, 3)]
    assert st.retrieve(vol.volume_id).status == "bound"
    with pytest.raises(together.BadRequestError, match="attached"):
        st.delete(vol.volume_id)
    with pytest.raises(together.BadRequestError, match="already attached"):
        create(sdk, cluster_name="other", volume_id=vol.volume_id)
    sdk.clusters.delete(c.cluster_id)
    assert st.retrieve(vol.volume_id).status == "available"  # it outlives the cluster
    assert st.delete(vol.volume_id).success is True
    with pytest.raises(together.NotFoundError):
        st.retrieve(vol.volume_id)

    made = create(
        sdk, cluster_name="with-shared", shared_volume={"volume_name": "scratch", "size_tib": 1}
    )
    (sv,) = sdk.clusters.retrieve(made.cluster_id).volumes
    assert st.retrieve(sv.volume_id).volume_name == "scratch"
    sdk.clusters.delete(made.cluster_id)  # a shared_volume lives and dies with its cluster
    with pytest.raises(together.NotFoundError):
        st.retrieve(sv.volume_id)
