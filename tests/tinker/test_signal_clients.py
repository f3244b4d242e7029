"""A signal's handler stops what a Tinker script holds through HTTP clients of its own.

SIGTERM lands in the main thread between two bytecodes, and that thread may be inside an HTTP
request of the endpoint's client: httpcore's connection pool holds its (non-reentrant) lock while
it hands out or gives back a connection. A handler that sent its stop through that client would
wait on that lock forever (seen once in CI: a script interrupted while its resource provisioned,
under three workers' load, did not end within 120 s). Against the real emulator daemon over
loopback HTTP; the interrupted request is stood in for by holding the pool's own lock, as that
thread would, since a signal cannot be aimed at that instruction."""

from __future__ import annotations

import gc
import threading

import pytest
from together import Together

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker
from tgnb.tinker import _pool
from tgnb.tinker._support import wait_for_releases


def test_the_handlers_stop_waits_on_no_lock_of_the_interrupted_request(
    rl_emulator: EmulatorHandle,
) -> None:
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model="tgnb/tiny-llama", rank=4)
    pools = [pool for pool in list(_pool._POOLS) if pool._held]
    assert pools, "no pool holds the resource just made"
    conn = pools[0]._conn
    resources = {h.client.model_resources_id for pool in pools for h in pool._held}
    pool_lock = conn.sdk()._client._transport._pool._optional_thread_lock._lock  # type: ignore[attr-defined]
    done = threading.Event()

    def handler() -> None:  # what `_signals` runs, here in a thread so that a hang can be seen
        _pool.stop_everything(report=False)
        done.set()

    with pool_lock:  # the main thread, interrupted inside a request of the endpoint's client
        worker = threading.Thread(target=handler, daemon=True)
        worker.start()
        worker.join(timeout=60)
        finished = done.is_set()
    assert finished, "the handler's stop waited on the interrupted request's pool"
    with Together() as client:
        statuses = {
            rid: client.post_training.model_resources.retrieve(rid).status for rid in resources
        }
    assert all(s == "MODEL_RESOURCES_STATUS_STOPPED" for s in statuses.values()), statuses
    del training, service  # their releases find the resource stopped
    gc.collect()
    wait_for_releases()
