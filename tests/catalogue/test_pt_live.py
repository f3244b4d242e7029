"""A live Post-Training session under hostile operations, over real HTTP against a real daemon
(the built-in tiny model, real torch): every case of `LIVE_CASES` is refused with a 400 whose
one-line message names the field, before anything is computed (the session's step and weights
unchanged), and never as INTERNAL_ERROR. Plus what needs more than one request: a non-finite
ratio, gradients beyond float32, a reused Idempotency-Key with another body, a payload nested too
deep or too large, and stopping a session while its sample runs.

Raw httpx: these are bodies the SDK would never send.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import wait_until
from tgnb.emulator.testing import EmulatorHandle, running_emulator

from .conftest import FAKE_KEY, record

TINY = "tgnb/tiny-llama"
MR, TS = "/v1/rl/model-resources", "/v1/rl/training-sessions"
CE = {"type": "LOSS_TYPE_CROSS_ENTROPY"}
DONE = ("TRAINING_OPERATION_STATUS_COMPLETED", "TRAINING_OPERATION_STATUS_FAILED")


def seq(tokens: list[int]) -> dict[str, Any]:
    return {"chunks": [{"encoded_text": {"tokens": list(tokens)}}]}


def ce_sample(n: int = 4, **weights: Any) -> dict[str, Any]:
    """A cross-entropy sample of `n` input tokens; `weights` overrides the weights TensorData."""
    tokens = [(7 * i) % 90 + 5 for i in range(n + 1)]
    return {
        "model_input": seq(tokens[:-1]),
        "loss_fn_inputs": {
            "target_tokens": {"data": tokens[1:], "dtype": "int64"},
            "weights": {"data": [1.0] * n, "dtype": "float32", **weights},
        },
    }


def policy_sample(n: int = 4, q: float = -1.0, adv: float = 1.0) -> dict[str, Any]:
    tokens = [(5 * i) % 90 + 5 for i in range(n + 1)]
    return {
        "model_input": seq(tokens[:-1]),
        "loss_fn_inputs": {
            "target_tokens": {"data": tokens[1:], "dtype": "int64"},
            "logprobs": {"data": [q] * n, "dtype": "float32"},
            "advantages": {"data": [adv] * n, "dtype": "float32"},
        },
    }


def cfb(value: float, n: int = 4) -> dict[str, Any]:
    s = ce_sample(n)
    return {
        "samples": [{"model_input": s["model_input"], "loss_fn_inputs": {
            "target_tokens": s["loss_fn_inputs"]["target_tokens"]}}],
        "gradients": [{"data": [value] * n, "dtype": "float32"}],
    }  # fmt: skip


def sample_body(rows: int = 1, n: int = 1, max_tokens: int = 1, **params: Any) -> dict[str, Any]:
    return {
        "model_inputs": [seq([5, 6, 7])] * rows,
        "num_samples": n,
        "sampling_params": {"max_tokens": max_tokens, "seed": 1, **params},
    }


@dataclass(frozen=True)
class LiveCase:
    id: str
    kind: str
    body: Any
    field: str  # named in the refusal's message


LIVE_CASES: list[LiveCase] = [
    # issue 24 item 18: values that crashed the engine as INTERNAL_ERROR
    LiveCase("tensordata-shape-int", "forward-backward",
             {"loss": CE, "samples": [ce_sample(shape=5)]}, "shape"),
    LiveCase("tensordata-shape-string", "forward-backward",
             {"loss": CE, "samples": [ce_sample(shape="4")]}, "shape"),
    LiveCase("grpo-clip-high-1e308", "forward-backward",
             {"loss": {"type": "LOSS_TYPE_GRPO", "grpo_params": {"clip_high_threshold": 1e308}},
              "samples": [policy_sample()]}, "clip_high_threshold"),
    LiveCase("ppo-clip-high-1e308", "forward-backward",
             {"loss": {"type": "LOSS_TYPE_PPO", "ppo_params": {"clip_high_threshold": 1e308}},
              "samples": [policy_sample()]}, "clip_high_threshold"),
    LiveCase("sample-temperature-1e-300", "sample", sample_body(temperature=1e-300), "temperature"),
    LiveCase("sample-top_p-1e-300", "sample", sample_body(top_p=1e-300), "top_p"),
    LiveCase("weights-int-beyond-int64", "forward-backward",
             {"loss": CE, "samples": [ce_sample(data=[10**400] * 4)]}, "weights"),
    # item 5: finite in float64, inf in float32
    LiveCase("custom-gradient-1e39", "custom-forward-backward", cfb(1e39), "gradients[0]"),
    LiveCase("ce-weight-1e39", "forward-backward",
             {"loss": CE, "samples": [ce_sample(data=[1e39] * 4)]}, "weights"),
    LiveCase("grpo-logprobs-minus-1e39", "forward-backward",
             {"loss": {"type": "LOSS_TYPE_GRPO"}, "samples": [policy_sample(q=-1e39)]},
             "logprobs"),
    # optimizer numbers: eps 0 divides 0 by 0 where a gradient is 0; lr 1e308 is inf in float32
    LiveCase("adam-eps-0", "optim-step", {"adam_params": {"eps": 0}}, "eps"),
    LiveCase("adam-lr-1e308", "optim-step", {"adam_params": {"learning_rate": 1e308}},
             "learning_rate"),
    # item 6: per-operation work caps (max_batch_size 512, 32768 tokens)
    LiveCase("forward-backward-2000-samples", "forward-backward",
             {"loss": CE, "samples": [ce_sample(1)] * 2000}, "max_batch_size"),
    LiveCase("forward-backward-over-token-cap", "forward-backward",
             {"loss": CE, "samples": [ce_sample(255)] * 140}, "32768"),
    LiveCase("sample-600-samples", "sample", sample_body(n=600), "num_samples"),
    LiveCase("sample-rows-over-batch", "sample", sample_body(rows=4, n=200), "max_batch_size"),
    LiveCase("sample-generated-over-cap", "sample", sample_body(n=256, max_tokens=200),
             "max_tokens"),
]  # fmt: skip


@dataclass
class Live:
    emu: EmulatorHandle
    c: httpx.Client
    rid: str
    sid: str


def _ready(c: httpx.Client) -> str:
    r = c.post(MR, json={"base_model": TINY, "lora_enabled": True, "inactive_timeout": 86400})
    assert r.status_code == 200, r.text
    rid = str(r.json()["id"])
    deadline = time.monotonic() + 180
    while c.get(f"{MR}/{rid}").json()["status"] != "MODEL_RESOURCES_STATUS_READY":
        assert time.monotonic() < deadline, "the resource never became READY"
    return rid


def _session(c: httpx.Client, rid: str) -> str:
    r = c.post(TS, json={"model_resources_id": rid, "lora_config": {"rank": 4, "seed": 3}})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "TRAINING_SESSION_STATUS_RUNNING", r.text
    return str(r.json()["id"])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    home: Path = tmp_path_factory.mktemp("pt-live")
    with (
        running_emulator(home, time_scale=0.01) as emu,
        httpx.Client(
            base_url=emu.base_url, headers={"Authorization": f"Bearer {emu.api_key}"}, timeout=120
        ) as c,
    ):
        rid = _ready(c)
        yield Live(emu, c, rid, _session(c, rid))


def post(live: Live, kind: str, body: Any, key: str | None = None, sid: str = "") -> httpx.Response:
    headers = {"Idempotency-Key": key or str(uuid.uuid4())}
    return live.c.post(
        f"{TS}/{sid or live.sid}/operations/{kind}", json=body, headers=headers, timeout=120
    )


def finished(live: Live, r: httpx.Response, kind: str, sid: str = "") -> dict[str, Any]:
    """The operation of `r`, polled until it is done."""
    got = dict(r.json())
    while got["status"] not in DONE:
        g = live.c.get(f"{TS}/{sid or live.sid}/operations/{kind}/{got['id']}")
        assert g.status_code == 200, g.text
        got = dict(g.json())
    return got


def probe(live: Live) -> float:
    """A forward-only loss on a fixed sample: it changes only when the trainer's weights do."""
    r = post(
        live, "forward-backward", {"loss": CE, "samples": [ce_sample(8)], "forward_only": True}
    )
    assert r.status_code == 200, r.text
    out = finished(live, r, "forward-backward")
    assert out["status"] == DONE[0], out
    return float(out["output"]["loss"])


def step(live: Live) -> int:
    return int(live.c.get(f"{TS}/{live.sid}").json().get("step") or 0)


@pytest.mark.parametrize("case", LIVE_CASES, ids=[c.id for c in LIVE_CASES])
def test_live_case_is_refused_cleanly(live: Live, case: LiveCase) -> None:
    before = (step(live), probe(live))
    r = post(live, case.kind, case.body)
    text = r.text
    server_error = r.status_code >= 500 or "INTERNAL_ERROR" in text
    secret = FAKE_KEY in text or live.emu.api_key in text
    msg = r.json().get("message", "") if r.status_code == 400 else ""
    ok = r.status_code == 400 and case.field in msg and "\n" not in msg
    after = (step(live), probe(live))
    record(ok and after == before, server_error, secret)
    assert not server_error, text[:400]
    assert r.status_code == 400, text[:400]
    assert case.field in msg and "\n" not in msg, msg
    assert after == before, "the refused operation changed the session"


def test_nonfinite_ratio_is_answered_and_applied_once(live: Live) -> None:
    """Sampler logprobs of -100 (the ratio exp(95) overflows float32): the POST and the GET answer
    200, the request log has it, the same key gives the same operation, the step is applied once
    and the weights stay finite."""
    live.emu.clear_requests()
    body = {"loss": {"type": "LOSS_TYPE_GRPO"}, "samples": [policy_sample(q=-100.0)] * 2}
    key = str(uuid.uuid4())
    r = post(live, "forward-backward", body, key)
    ok = r.status_code == 200
    got = finished(live, r, "forward-backward") if ok else {}
    again = post(live, "forward-backward", body, key) if ok else r
    g = live.c.get(f"{TS}/{live.sid}/operations/forward-backward/{got.get('id')}")
    logged = [
        q for q in live.emu.requests()
        if q["method"] == "POST" and q["path"].endswith("/operations/forward-backward")
    ]  # fmt: skip
    opt = post(live, "optim-step", {})
    loss = probe(live)
    ok = (
        ok
        and got.get("status") == DONE[0]
        and g.status_code == 200
        and again.status_code == 200
        and again.json()["id"] == got["id"]
        and len(logged) >= 2
        and all(q["status"] == 200 for q in logged[:2])
        and opt.status_code == 200
        and loss == loss  # not NaN
    )
    record(ok, r.status_code >= 500 or g.status_code >= 500)
    assert r.status_code == 200, r.text[:300]
    assert got["status"] == DONE[0], got
    assert g.status_code == 200, g.text[:300]
    assert again.json()["id"] == got["id"]
    assert len(logged) >= 2 and all(q["status"] == 200 for q in logged[:2]), logged
    assert loss == loss, "the weights became NaN"


def test_float32_overflowing_gradients_never_reach_the_weights(live: Live) -> None:
    """3e38 is a float32, but Σ g·logp overflows: refused (NON_FINITE_LOSS), nothing accumulated;
    an optim-step afterwards leaves the weights as they were, and finite."""
    before = probe(live)
    r = post(live, "custom-forward-backward", cfb(3e38))
    got = finished(live, r, "custom-forward-backward") if r.status_code == 200 else {}
    code = (got.get("error") or {}).get("code", "")
    opt = post(live, "optim-step", {})
    after = probe(live)
    ok = r.status_code in (200, 400) and "NON_FINITE" in (code or r.text) and after == before
    record(ok, r.status_code >= 500)
    assert r.status_code in (200, 400), r.text[:300]
    assert "NON_FINITE" in (code or r.text), got or r.text
    assert opt.status_code == 200
    assert after == before and after == after, (before, after)


def test_reused_key_with_another_body_is_422(live: Live) -> None:
    key = str(uuid.uuid4())
    first = post(live, "forward-backward", {"loss": CE, "samples": [ce_sample(3)]}, key)
    assert first.status_code == 200, first.text
    other = post(live, "forward-backward", {"loss": CE, "samples": [ce_sample(6)]}, key)
    same = post(live, "forward-backward", {"loss": CE, "samples": [ce_sample(3)]}, key)
    msg = other.json().get("message", "") if other.status_code == 422 else ""
    ok = other.status_code == 422 and "Idempotency-Key" in msg and "\n" not in msg
    ok = ok and same.status_code == 200 and same.json()["id"] == first.json()["id"]
    record(ok, other.status_code >= 500)
    assert other.status_code == 422, other.text[:300]
    assert "Idempotency-Key" in msg
    assert same.json()["id"] == first.json()["id"]


def _upload(live: Live, data: bytes) -> tuple[int, str]:
    u = live.c.post(f"{TS}/{live.sid}/payloads/upload-url")
    assert u.status_code == 200, u.text
    put = httpx.put(u.json()["upload_url"], content=data, timeout=120)
    return put.status_code, str(u.json()["payload_id"])


def test_payload_nested_50k_deep_is_400(live: Live) -> None:
    status, pid = _upload(live, b'{"samples": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")
    assert status == 200
    before = step(live)
    r = post(live, "forward-backward", {"payload_id": pid})
    got = r.json()
    server_error = r.status_code >= 500 or "INTERNAL_ERROR" in r.text
    ok = r.status_code == 400 and "payload" in got.get("message", "") and step(live) == before
    record(ok, server_error)
    assert not server_error, r.text[:300]
    assert r.status_code == 400, r.text[:300]


def test_payload_over_the_cap_is_413(live: Live) -> None:
    status, _ = _upload(live, b" " * (17 << 20))
    record(status == 413)
    assert status == 413, status


def test_stopping_a_session_cancels_its_running_sample(live: Live) -> None:
    """The largest accepted sample (128 rows x 255 tokens); the session is stopped while it runs:
    the operation ends FAILED SESSION_NOT_ACTIVE at the next token, not after the whole batch."""
    sid = _session(live.c, live.rid)
    answer: dict[str, Any] = {}

    def run() -> None:
        answer["r"] = post(live, "sample", sample_body(n=128, max_tokens=255), sid=sid)

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: live.emu.health()["rl_operations_running"] > 0)
    time.sleep(0.5)
    stopped = live.c.post(f"{TS}/{sid}/stop")
    stopped_at = time.monotonic()
    t.join(120)
    got = finished(live, answer["r"], "sample", sid)
    took = time.monotonic() - stopped_at
    code = (got.get("error") or {}).get("code", "")
    ok = stopped.status_code == 200 and got["status"] == DONE[1] and "SESSION_NOT_ACTIVE" in code
    record(ok)
    assert stopped.status_code == 200, stopped.text
    assert got["status"] == DONE[1] and "SESSION_NOT_ACTIVE" in code, (got["status"], code, took)
