"""A bounded burst against a real emulator daemon on loopback: 2,000 requests from 20 threads,
valid ones (create, update, retrieve, list) mixed with the catalogue's hostile ones. No 5xx, no
confirmed write lost, and the health route answers throughout."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tgnb.emulator.testing import EmulatorHandle, running_emulator

from .tables import ALL, SEED, Raw

THREADS, PER_THREAD = 20, 100
HOSTILE = [
    c
    for c in ALL
    if "{" not in c.path and not (isinstance(c.body, Raw) and len(c.body.data) > 300_000)
]


@pytest.fixture
def emu(tmp_path: Any) -> Iterator[EmulatorHandle]:
    with running_emulator(tmp_path, time_scale=0.01) as handle:
        yield handle


def _hostile(client: httpx.Client, emu: EmulatorHandle, rng: random.Random) -> int:
    case = rng.choice(HOSTILE)
    headers = {} if case.auth is None else {"Authorization": case.auth}
    if case.auth == "key":
        headers["Authorization"] = f"Bearer {emu.api_key}"
    kw: dict[str, Any] = {}
    if isinstance(case.body, Raw):
        kw["content"] = case.body.data
    elif case.body is not None:
        kw["json"] = case.body
    r = client.request(case.method, case.path, headers=headers, **kw)
    assert r.status_code == case.status, (case.id, r.status_code)
    return r.status_code


@pytest.mark.slow
def test_burst_of_mixed_requests(emu: EmulatorHandle) -> None:
    statuses: list[int] = []
    health: list[int] = []
    created: list[str] = []
    targets: dict[str, int] = {}
    errors: list[BaseException] = []
    lock = threading.Lock()
    stop = threading.Event()
    auth = {"Authorization": f"Bearer {emu.api_key}"}

    def watch() -> None:
        with httpx.Client(base_url=emu.base_url, headers=auth, timeout=10) as c:
            while not stop.is_set():
                try:
                    health.append(c.get("/_emulator/health").status_code)
                except httpx.HTTPError:
                    health.append(0)
                time.sleep(0.05)

    def worker(i: int) -> None:
        rng = random.Random(i)
        try:
            with httpx.Client(base_url=emu.base_url, timeout=60) as c:
                r = c.post(
                    "/v1/compute/clusters",
                    json={**SEED, "cluster_name": f"burst-{i}"},
                    headers=auth,
                )
                statuses.append(r.status_code)
                mine = r.json()["cluster_id"]
                with lock:
                    created.append(mine)
                for n in range(PER_THREAD - 1):
                    roll = rng.random()
                    if roll < 0.1:
                        want = 8 * rng.randrange(0, 4)
                        r = c.put(
                            f"/v1/compute/clusters/{mine}",
                            json={"num_preemptible_gpus": want},
                            headers=auth,
                        )
                        if r.status_code == 200:
                            targets[mine] = want
                    elif roll < 0.15:
                        r = c.post(
                            "/v1/compute/clusters",
                            json={**SEED, "cluster_name": f"burst-{i}-{n}"},
                            headers=auth,
                        )
                        if r.status_code == 200:
                            with lock:
                                created.append(r.json()["cluster_id"])
                    elif roll < 0.25:
                        r = c.get(f"/v1/compute/clusters/{mine}", headers=auth)
                    elif roll < 0.28:
                        r = c.get("/v1/compute/clusters", headers=auth)
                    else:
                        statuses.append(_hostile(c, emu, rng))
                        continue
                    statuses.append(r.status_code)
        except BaseException as exc:
            errors.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    watcher.join()
    assert not errors, errors[:3]
    assert len(statuses) == THREADS * PER_THREAD
    assert not [s for s in statuses if s >= 500]
    assert health and all(s == 200 for s in health)
    listed = {c["cluster_id"]: c for c in emu._call("GET", "/v1/compute/clusters")["clusters"]}
    assert set(created) <= set(listed)  # no confirmed create lost
    for cid, want in targets.items():  # no confirmed update lost
        assert listed[cid]["desired_preemptible_gpus"] == want
