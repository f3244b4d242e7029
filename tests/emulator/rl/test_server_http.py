"""The emulator's /v1/rl routes over real HTTP (a real daemon, the built-in tiny model, real torch).

Raw httpx where the point is what the server does with what the SDK would never send (bad bodies,
retried Idempotency-Keys, a wrong key); the unmodified SDK elsewhere.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import together

from tests.conftest import wait_until
from tgnb.emulator.models import REMOVED
from tgnb.emulator.testing import EmulatorHandle, running_emulator
from tgnb.events import parse_time

from .conftest import TINY, ce_sample, seq

MR, TS = "/v1/rl/model-resources", "/v1/rl/training-sessions"


def http(emu: EmulatorHandle, key: str | None = None) -> httpx.Client:
    return httpx.Client(
        base_url=emu.base_url,
        headers={"Authorization": f"Bearer {key or emu.api_key}"},
        timeout=120,
    )


def ready_resource(c: httpx.Client, **body: Any) -> dict[str, Any]:
    r = c.post(MR, json={"base_model": TINY, "lora_enabled": True, **body})
    assert r.status_code == 200, r.text
    rid = r.json()["id"]
    deadline = time.monotonic() + 120
    while True:
        got = c.get(f"{MR}/{rid}").json()
        if got["status"] == "MODEL_RESOURCES_STATUS_READY" or time.monotonic() > deadline:
            return dict(got)


def open_session(c: httpx.Client, rid: str, **body: Any) -> dict[str, Any]:
    r = c.post(TS, json={"model_resources_id": rid, **body})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "TRAINING_SESSION_STATUS_RUNNING"
    return dict(r.json())


def op(c: httpx.Client, sid: str, kind: str, body: Any, key: str | None = None) -> httpx.Response:
    headers = {"Idempotency-Key": key or str(uuid.uuid4())}
    return c.post(f"{TS}/{sid}/operations/{kind}", json=body, headers=headers)


def batch(n: int, length: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [ce_sample([rng.randrange(3, 100) for _ in range(length)]) for _ in range(n)]


CE = {"type": "LOSS_TYPE_CROSS_ENTROPY", "cross_entropy_params": {}}


def logprobs(c: httpx.Client, sid: str, samples: list[dict[str, Any]]) -> list[list[float]]:
    body = {"loss": CE, "samples": samples, "forward_only": True, "return_loss_fn_outputs": True}
    r = op(c, sid, "forward-backward", body)
    assert r.json()["status"] == "TRAINING_OPERATION_STATUS_COMPLETED", r.text
    return [o["tensors"]["logprobs"]["data"] for o in r.json()["output"]["loss_fn_outputs"]]


def test_wrong_key_is_401_and_not_echoed(rl_emulator: EmulatorHandle) -> None:
    wrong = "sk-wrong-" + uuid.uuid4().hex
    with http(rl_emulator, wrong) as c:
        for path in ("/v1/rl/supported-models", f"{MR}/nope", "/v1/rl/checkpoints"):
            r = c.get(path)
            assert r.status_code == 401
            assert wrong not in r.text and "sk-wrong" not in r.text
    logged = str(rl_emulator.requests())
    assert wrong not in logged and rl_emulator.api_key not in logged


def test_unknown_ids_are_404(rl_emulator: EmulatorHandle) -> None:
    with http(rl_emulator) as c:
        for path in (f"{MR}/x", f"{TS}/x", "/v1/rl/checkpoints/x", f"{TS}/x/operations/sample/y"):
            assert c.get(path).status_code == 404, path
        assert c.post(f"{TS}/x/operations/optim-step", json={}).status_code == 404


def test_bad_creates_are_400_naming_the_field_and_store_nothing(
    rl_emulator: EmulatorHandle,
) -> None:
    with http(rl_emulator) as c:
        before = len(c.get(MR).json()["data"])
        cases = [
            ({"base_model": "acme/no-such-model"}, "base_model"),
            ({"base_model": TINY, "inactive_timeout": 10}, "inactive_timeout"),
            ({"base_model": TINY, "compute_config": {"gpu_type": "A100"}}, "gpu_type"),
        ]
        for body, field in cases:
            r = c.post(MR, json=body)
            assert r.status_code == 400 and field in r.json()["message"], r.text
        r = c.post(MR, content=b'{"base_model": "tgnb/tiny-llama", "inactive_timeout": NaN}')
        assert r.status_code == 400 and "inactive_timeout" in r.json()["message"]
        assert len(c.get(MR).json()["data"]) == before

        rid = ready_resource(c)["id"]
        sessions = len(c.get(TS).json()["data"])
        for lora, field in (({"rank": 100000}, "lora_config.rank"), ({"alpha": -1}, "alpha")):
            r = c.post(TS, json={"model_resources_id": rid, "lora_config": lora})
            assert r.status_code == 400 and field in r.json()["message"], r.text
        r = c.post(TS, json={"model_resources_id": rid, "resume_from_checkpoint_id": "nope"})
        assert r.status_code == 400 and "resume_from_checkpoint_id" in r.json()["message"]
        assert len(c.get(TS).json()["data"]) == sessions
        c.post(f"{MR}/{rid}/stop?force=true")


def test_bad_operation_bodies_bypassing_the_sdk(rl_emulator: EmulatorHandle) -> None:
    with http(rl_emulator) as c:
        rid = ready_resource(c)["id"]
        sid = open_session(c, rid, lora_config={"rank": 4, "seed": 1})["id"]
        probe = batch(2, 8, seed=3)
        start = logprobs(c, sid, probe)
        good = ce_sample([5, 6, 7, 8, 9])
        missing = {"model_input": good["model_input"], "loss_fn_inputs": {}}
        short = {
            "model_input": good["model_input"],
            "loss_fn_inputs": {
                "target_tokens": {"data": [6, 7], "dtype": "int64"},
                "weights": {"data": [1.0, 1.0], "dtype": "float32"},
            },
        }
        for sample, field in ((missing, "target_tokens"), (short, "target_tokens")):
            r = op(c, sid, "forward-backward", {"loss": CE, "samples": [sample]})
            assert r.status_code == 400, r.text
            assert field in r.json()["message"]
        raw = (
            b'{"loss": {"type": "LOSS_TYPE_CROSS_ENTROPY"}, "samples": [{"model_input": '
            b'{"chunks": [{"encoded_text": {"tokens": [5, 6]}}]}, "loss_fn_inputs": {"weights": '
            b'{"data": [1.0, Infinity], "dtype": "float32"}}}]}'
        )
        r = c.post(f"{TS}/{sid}/operations/forward-backward", content=raw)
        assert r.status_code == 400
        assert "samples[0].loss_fn_inputs.weights.data[1]" in r.json()["message"]
        # nothing was applied: an optimizer step now has no gradient from the refused bodies
        assert op(c, sid, "optim-step", {"adam_params": {"learning_rate": 0.05}}).status_code == 200
        assert logprobs(c, sid, probe) == start
        # an operation on a stopped session fails SESSION_NOT_ACTIVE
        c.post(f"{TS}/{sid}/stop")
        r = op(c, sid, "optim-step", {})
        assert r.status_code == 200
        assert r.json()["status"] == "TRAINING_OPERATION_STATUS_FAILED"
        assert r.json()["error"]["code"] == "TRAINING_OPERATION_ERROR_CODE_SESSION_NOT_ACTIVE"
        c.post(f"{MR}/{rid}/stop?force=true")


def test_retried_key_applies_once(rl_emulator: EmulatorHandle) -> None:
    """Three sessions with the same LoRA seed: retried keys (A) == single applications (B);
    the same bodies really applied twice (C) differ, so the comparison can fail."""
    b1, b2, probe = batch(4, 12, 1), batch(4, 12, 2), batch(2, 12, 9)
    fb = lambda b: {"loss": CE, "samples": b}  # noqa: E731
    adam = {"adam_params": {"learning_rate": 0.05}}
    with http(rl_emulator) as c:
        rid = ready_resource(c)["id"]
        open_session(c, rid, lora_config={"rank": 4})  # the first adapter wraps the base model
        a, b, d = (open_session(c, rid, lora_config={"rank": 4, "seed": 7})["id"] for _ in "abd")
        ids = {op(c, a, "forward-backward", fb(b1), key="k1").json()["id"] for _ in range(3)}
        assert len(ids) == 1
        op(c, a, "forward-backward", fb(b2), key="k2")
        steps = [op(c, a, "optim-step", adam, key="k3").json() for _ in range(2)]
        assert steps[0] == steps[1] and steps[0]["output"]["step"] == "1"

        op(c, b, "forward-backward", fb(b1))
        op(c, b, "forward-backward", fb(b2))
        op(c, b, "optim-step", adam)
        for _ in range(2):
            op(c, d, "forward-backward", fb(b1))
        op(c, d, "forward-backward", fb(b2))
        op(c, d, "optim-step", adam)

        la, lb, ld = (logprobs(c, s, probe) for s in (a, b, d))
        flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
        assert max(abs(x - y) for x, y in zip(flat(la), flat(lb), strict=False)) < 1e-5
        assert max(abs(x - y) for x, y in zip(flat(la), flat(ld), strict=False)) > 1e-4
        assert c.get(f"{TS}/{a}").json()["step"] == "1"
        c.post(f"{MR}/{rid}/stop?force=true")


def test_health_answers_while_a_forward_backward_runs(rl_emulator: EmulatorHandle) -> None:
    with http(rl_emulator) as c:
        rid = ready_resource(c)["id"]
        sid = open_session(c, rid, lora_config={"rank": 8})["id"]
        big = {"loss": CE, "samples": batch(64, 128, seed=5)}
        result: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: result.append(op(c, sid, "forward-backward", big)))
        worker.start()
        wait_until(lambda: rl_emulator.health()["rl_operations_running"] or result)
        during = []  # latencies of health answers that saw the forward-backward still running
        while True:
            t0 = time.perf_counter()
            running = rl_emulator.health()["rl_operations_running"]
            if not running:
                break
            during.append(time.perf_counter() - t0)
        worker.join()
        assert result[0].json()["status"] == "TRAINING_OPERATION_STATUS_COMPLETED"
        print(f"health during fb: {len(during)} answers, max {max(during or [0]) * 1000:.1f} ms")
        assert len(during) >= 3
        c.post(f"{MR}/{rid}/stop?force=true")


def test_five_lora_sessions_share_one_resource_sixth_waits(rl_emulator: EmulatorHandle) -> None:
    client = together.Together(max_retries=0)
    with http(rl_emulator) as c:
        rid = ready_resource(c)["id"]
        sids = [open_session(c, rid, lora_config={"rank": 8, "seed": i})["id"] for i in range(5)]
        probe = batch(2, 10, seed=4)
        base = logprobs(c, sids[0], probe)
        for i, sid in enumerate(sids):
            op(c, sid, "forward-backward", {"loss": CE, "samples": batch(4, 10, seed=i)})
            assert op(c, sid, "optim-step", {"adam_params": {"learning_rate": 0.02 * (i + 1)}})
        after = [logprobs(c, sid, probe) for sid in sids]
        assert all(a != base for a in after)
        assert len({str(a) for a in after}) == 5  # independent adapters
        sixth = c.post(TS, json={"model_resources_id": rid})
        assert sixth.status_code == 429
        assert int(sixth.headers["retry-after-ms"]) > 0
        with pytest.raises(together.RateLimitError):
            client.post_training.sessions.create(model_resources_id=rid)
        mem5 = rl_emulator.rl_memory(rid)
        c.post(f"{TS}/{sids[0]}/stop")
        fresh = open_session(c, rid, lora_config={"rank": 8, "seed": 0})["id"]
        assert logprobs(c, fresh, probe) == base  # the base weights did not change
        for sid in [*sids[1:], fresh]:
            c.post(f"{TS}/{sid}/stop")
        c.post(f"{MR}/{rid}/stop")
        rid1 = ready_resource(c)["id"]
        base_bytes = rl_emulator.rl_memory(rid1)  # the base model alone
        one = open_session(c, rid1, lora_config={"rank": 8})["id"]
        op(c, one, "forward-backward", {"loss": CE, "samples": batch(4, 10)})
        op(c, one, "optim-step", {"adam_params": {"learning_rate": 0.02}})
        mem1 = rl_emulator.rl_memory(rid1)
        assert base_bytes and mem1 and mem5
        per_session = mem1 - base_bytes
        print(f"memory 5 sessions / 1 session: {mem5 / mem1:.3f} (tiny: base {base_bytes} B)")
        # the base weights are held once: 5 sessions cost the base + 5 x one session's share
        assert mem5 == pytest.approx(base_bytes + 5 * per_session, rel=0.1)
        assert mem5 < 5 * mem1 - 3 * base_bytes
        c.post(f"{MR}/{rid1}/stop?force=true")


def test_stop_refused_while_sessions_run_then_usage_and_cost(
    rl_emulator: EmulatorHandle,
) -> None:
    client = together.Together()
    with http(rl_emulator) as c:
        res = ready_resource(c, compute_config={"num_generator_replicas": 2})
        rid = res["id"]
        assert res["status_details"] == {} and res["expires_at"]
        sid = open_session(c, rid)["id"]
        r = c.post(f"{MR}/{rid}/stop")
        assert r.status_code == 400 and sid in r.json()["message"]
        with pytest.raises(together.BadRequestError):
            client.post_training.model_resources.stop(rid)
        assert c.get(f"{MR}/{rid}").json()["status"] == "MODEL_RESOURCES_STATUS_READY"
        r = c.post(f"{MR}/{rid}/stop?force=true")
        assert r.json()["status"] == "MODEL_RESOURCES_STATUS_STOPPED"
        assert c.get(f"{TS}/{sid}").json()["status"] == "TRAINING_SESSION_STATUS_STOPPED"
        u1 = rl_emulator.rl_usage(rid)
        time.sleep(0.2)
        assert rl_emulator.rl_usage(rid) == u1  # nothing counted after STOPPED
        assert u1["gpus"] == 3 and u1["gpu_seconds"] > 0 and u1["resource_id"] == rid
        assert u1["gpu_minutes"] == pytest.approx(u1["gpu_seconds"] / 60)
        assert u1["ready_at"] and u1["stopped_at"] and u1["created_at"] and u1["queued_s"] >= 0
        assert u1["cost"] == pytest.approx(u1["gpu_seconds"] / 3600 * 9.0)
    est = client.post_training.model_resources.estimate_cost(
        base_model=TINY, compute_config={"num_generator_replicas": 1}
    )
    assert (est.currency, est.price_per_hour) == ("USD", 18.0)


def test_queue_position_under_the_shared_gpu_cap(rl_emulator: EmulatorHandle) -> None:
    rl_emulator.set_capacity(3)
    try:
        with http(rl_emulator) as c:
            first = ready_resource(c)  # 2 GPUs: trainer + one generator
            second = c.post(MR, json={"base_model": TINY}).json()
            third = c.post(MR, json={"base_model": TINY}).json()
            got = [c.get(f"{MR}/{x['id']}").json() for x in (second, third)]
            assert [g["status"] for g in got] == ["MODEL_RESOURCES_STATUS_PENDING"] * 2
            assert [g["status_details"]["queue_position"] for g in got] == [1, 2]
            c.post(f"{MR}/{first['id']}/stop")
            wait_until(
                lambda: (
                    c.get(f"{MR}/{second['id']}").json()["status"] == "MODEL_RESOURCES_STATUS_READY"
                )
            )
            assert c.get(f"{MR}/{third['id']}").json()["status_details"]["queue_position"] == 1
            for x in (second, third):
                c.post(f"{MR}/{x['id']}/stop")
            assert rl_emulator.rl_usage(third["id"])["gpu_seconds"] == 0
    finally:
        rl_emulator.set_capacity(None)


def test_inactivity_expiry_stops_the_resource(rl_emulator: EmulatorHandle) -> None:
    with http(rl_emulator) as c:
        res = ready_resource(c, inactive_timeout=300)  # real seconds at any time scale
        rid = res["id"]
        sid = open_session(c, rid, display_name="a")["id"]
        later = c.post(f"{MR}/{rid}/extend-expiry", json={"seconds": 400}).json()["expires_at"]
        assert parse_time(later) > parse_time(res["expires_at"])
        assert c.post(f"{MR}/{rid}/extend-expiry", json={"seconds": -1}).status_code == 400
        renamed = together.Together().post_training.sessions.update(sid, display_name="b")
        assert renamed.display_name == "b"
        time.sleep(3.5)  # 300 x 0.01 s: the idle time is the user's, not scaled
        assert c.get(f"{MR}/{rid}").json()["status"] == "MODEL_RESOURCES_STATUS_READY"
        rl_emulator.rl_expire(rid)  # as if the 300 real seconds had passed
        wait_until(
            lambda: c.get(f"{MR}/{rid}").json()["status"] == "MODEL_RESOURCES_STATUS_STOPPED",
            timeout=60,
        )
        assert c.get(f"{TS}/{sid}").json()["status"] == "TRAINING_SESSION_STATUS_EXPIRED"
        assert c.post(f"{MR}/{rid}/extend-expiry", json={"seconds": 400}).status_code == 400
        r = op(c, sid, "forward-backward", {"loss": CE, "samples": [ce_sample([4, 5, 6])]})
        assert r.json()["error"]["code"] == "TRAINING_OPERATION_ERROR_CODE_SESSION_NOT_ACTIVE"


def test_the_idle_scale_shortens_only_the_wait(tmp_path: Path) -> None:
    """``rl_idle_scale`` (a test's knob, ``--rl-idle-scale``) counts the user's idle time at that
    many real seconds per second: inactive_timeout 300 at 0.02 expires 6 s after READY, an
    extend-expiry of 400 s ends 8 s later; the resource records the 300 it was asked for."""
    with running_emulator(tmp_path, time_scale=0.01, rl_idle_scale=0.02) as emu, http(emu) as c:
        res = ready_resource(c, inactive_timeout=300)
        assert res["inactive_timeout"] == 300
        rid = res["id"]
        ready = parse_time(emu.rl_usage(rid)["ready_at"]).timestamp()
        assert parse_time(res["expires_at"]).timestamp() == pytest.approx(ready + 6, abs=0.01)
        asked = time.time()
        later = c.post(f"{MR}/{rid}/extend-expiry", json={"seconds": 400}).json()["expires_at"]
        assert asked + 8 <= parse_time(later).timestamp() <= time.time() + 8
        wait_until(
            lambda: c.get(f"{MR}/{rid}").json()["status"] == "MODEL_RESOURCES_STATUS_STOPPED",
            timeout=60,
            what="the idle resource to stop itself",
        )


def test_large_payload_upload_path(rl_emulator: EmulatorHandle) -> None:
    with http(rl_emulator) as c:
        rid = ready_resource(c)["id"]
        sid = open_session(c, rid)["id"]
        up = c.post(f"{TS}/{sid}/payloads/upload-url").json()
        assert up["upload_url"].startswith(rl_emulator.base_url)
        samples = batch(3, 9, seed=2)
        r = httpx.put(up["upload_url"], json={"loss": CE, "samples": samples})  # no key
        assert r.status_code == 200
        inline = {"loss": CE, "samples": [seq([1])], "payload_id": up["payload_id"]}
        r = op(c, sid, "forward-backward", {**inline, "return_loss_fn_outputs": True})
        assert r.json()["status"] == "TRAINING_OPERATION_STATUS_COMPLETED", r.text
        assert len(r.json()["output"]["loss_fn_outputs"]) == 3
        bad = op(c, sid, "forward-backward", {**inline, "payload_id": "0" * 32})
        assert bad.status_code == 400 and "payload_id" in bad.json()["message"]
        assert httpx.put(rl_emulator.base_url + "/rl-blobs/guess", content=b"{}").status_code == 404
        c.post(f"{MR}/{rid}/stop?force=true")


def test_resources_and_preemptible_nodes_share_the_gpu_cap(rl_emulator: EmulatorHandle) -> None:
    """A cluster's preemptible nodes hold the cap: a resource queues; when they go, it starts.
    And a READY resource's GPUs keep a cluster's preemptible node from being provisioned."""
    sdk = rl_emulator.client(max_retries=0)
    rl_emulator.set_capacity(8)
    try:
        cluster = sdk.clusters.create(
            cluster_name="pt-cap",
            region="us-central-2",
            gpu_type="RTX_6000_PCI",
            cluster_type="KUBERNETES",
            num_gpus=8,
            billing_type="ON_DEMAND",
            nvidia_driver_version="570",
            cuda_version="12.8",
            num_preemptible_gpus=8,
            project_id=rl_emulator.project_id,
        )
        cid = cluster.cluster_id

        def preemptible_live() -> int:
            nodes = rl_emulator.nodes(cid)
            return sum(n["kind"] == "preemptible" and n["state"] == "running" for n in nodes)

        wait_until(preemptible_live)
        with http(rl_emulator) as c:
            rid = c.post(MR, json={"base_model": TINY}).json()["id"]
            got = c.get(f"{MR}/{rid}").json()
            assert got["status"] == "MODEL_RESOURCES_STATUS_PENDING"
            assert got["status_details"]["queue_position"] == 1
            sdk.clusters.update(cid, num_preemptible_gpus=0)
            wait_until(
                lambda: c.get(f"{MR}/{rid}").json()["status"] == "MODEL_RESOURCES_STATUS_READY"
            )
            sdk.clusters.update(cid, num_preemptible_gpus=8)
            time.sleep(1.5)  # 2.5 scaled provisioning delays: a node would have joined by now
            nodes = rl_emulator.nodes(cid)
            assert not [n for n in nodes if n["kind"] == "preemptible" and n["state"] != REMOVED]
            c.post(f"{MR}/{rid}/stop")
            wait_until(preemptible_live)
        sdk.clusters.delete(cid)
    finally:
        rl_emulator.set_capacity(None)
