"""What a Tinker script provisions on Post-Training, through ``import tgnb.tinker as tinker``
against the real emulator daemon over HTTP: the clients of one ``ServiceClient`` share one
Model Resource up to its session cap, training starts with no generator and moves onto a
resource with one (weights and optimizer) at its first sampler, samplers on saved weights share
one, clients created at once share too, and a resource stops with the last session on it; at exit a script says what its resources cost and
which it leaves running."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from together import Together
from together.post_training import ModelResourcesClient

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker  # the one line that differs from a Tinker script
from tgnb.tinker._pool import MAX_SESSIONS
from tgnb.tinker._support import wait_for_releases

types = tinker.types
MODEL = "tgnb/tiny-llama"
RUNNING = ("MODEL_RESOURCES_STATUS_PENDING", "MODEL_RESOURCES_STATUS_CREATING")


def running_resources() -> set[str]:
    """The project's resources that hold GPUs now, as the API lists them."""
    with Together() as client:
        page = client.post_training.model_resources.list(limit=100)
    return {r.id for r in page.data if r.status in (*RUNNING, "MODEL_RESOURCES_STATUS_READY")}


def _sft_step(client: tinker.TrainingClient) -> None:
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 5, 6, 7]),
        loss_fn_inputs={"target_tokens": [5, 6, 7, 8], "weights": [1.0] * 4},
    )
    client.forward_backward([datum], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result()


def generators_of(resource_id: str) -> int:
    with Together() as client:
        record = client.post_training.model_resources.retrieve(resource_id)
    return int(record.compute_config.num_generator_replicas or 0)


def test_samplers_dropped_unclosed_give_their_sessions_back(rl_emulator: EmulatorHandle) -> None:
    """Tinker lets a script open a sampler per evaluation and never close one. Here a sampler on
    saved weights owns a session, so dropping it gives the session back: twice the session cap
    of samplers, opened and dropped in turn, use the resources the first one did (kept, they
    would fill another one, and more). A future read after its client was dropped answers."""
    before = running_resources()
    service_client = tinker.ServiceClient()
    trainer = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=0)
    seen: set[str] = set()
    try:
        _sft_step(trainer)
        path = trainer.save_state("eval").result().path
        prompt = types.ModelInput.from_ints([1, 5, 6, 7])
        first: set[str] = set()
        for _ in range(2 * MAX_SESSIONS):
            future = service_client.create_sampling_client(model_path=path).compute_logprobs(prompt)
            gc.collect()  # the client is unreachable now: its future keeps it until read
            assert len(future.result()) == 4
            del future
            gc.collect()
            wait_for_releases()  # its release has run (a thread of its own)
            seen |= running_resources() - before
            first = first or set(seen)
    finally:
        trainer.close()
    assert seen == first, (first, seen)
    wait_for_releases()  # the dropped samplers' releases have all run
    assert running_resources() == before


def test_clients_of_one_service_client_share_resources_up_to_their_cap(
    rl_emulator: EmulatorHandle,
) -> None:
    before = running_resources()
    service_client = tinker.ServiceClient()
    clients: list[tinker.TrainingClient] = []
    samplers: list[tinker.SamplingClient] = []
    try:
        clients = [
            service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=i)
            for i in range(MAX_SESSIONS - 1)
        ]
        (trainer_resource,) = running_resources() - before  # four clients, one resource
        assert generators_of(trainer_resource) == 0  # supervised work pays no generator
        _sft_step(clients[0])
        path = clients[0].save_weights_for_sampler("step-1").result().path
        samplers.append(service_client.create_sampling_client(model_path=path))
        samplers.append(clients[1].create_sampling_client(path))
        (sampler_resource,) = running_resources() - before - {trainer_resource}  # one, shared
        assert generators_of(sampler_resource) == 1
        for client in clients:
            client.close()
        clients = []
        assert running_resources() == before | {sampler_resource}  # stopped with its last session
        for sampler in samplers:
            sampler.close()
        samplers = []
        assert running_resources() == before
    finally:
        for c in [*clients, *samplers]:
            c.close()


def test_load_state_works_on_a_resource_at_its_session_cap(rl_emulator: EmulatorHandle) -> None:
    """The API loads a checkpoint only into a new session; on a resource that holds its cap of
    sessions the client's own session gives its slot to the new one (the load was refused with a
    429 for want of a sixth). The loaded client then trains from the saved state, as a fresh
    client loaded from it does."""
    before = running_resources()
    service_client = tinker.ServiceClient()
    clients = [
        service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=i)
        for i in range(MAX_SESSIONS)
    ]
    try:
        (resource,) = running_resources() - before  # all five on one resource: it is full
        _sft_step(clients[0])
        path = clients[0].save_state("full").result().path
        clients[1].load_state_with_optimizer(path).result()
        assert running_resources() - before == {resource}
        probe = types.ModelInput.from_ints([1, 5, 6, 7])
        for client in clients[:2]:
            _sft_step(client)
        datum = types.Datum(
            model_input=probe,
            loss_fn_inputs={"target_tokens": [5, 6, 7, 8], "weights": [1.0] * 4},
        )
        original, loaded = (
            c.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
            for c in clients[:2]
        )
        assert loaded == pytest.approx(original, abs=1e-6)  # same state, same step: same weights
    finally:
        for client in clients:
            client.close()
    assert running_resources() == before


def test_the_first_sampler_moves_training_onto_a_generator_with_its_state(
    rl_emulator: EmulatorHandle,
) -> None:
    """Training starts with no generator; ``save_weights_and_get_sampling_client`` moves the
    session (weights and optimizer) onto a resource with one: the sampler samples the trained
    weights, and training goes on exactly as if nothing had moved."""
    before = running_resources()
    service_client = tinker.ServiceClient()
    tokens = [1, 5, 6, 7, 9, 11]
    everywhere = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )

    def logprobs(client: tinker.TrainingClient) -> list[float]:
        out = client.forward([everywhere], "cross_entropy").result()
        return list(out.loss_fn_outputs[0]["logprobs"].tolist())

    moved = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=5)
    reference = None
    try:
        (first,) = running_resources() - before
        assert generators_of(first) == 0
        for _ in range(2):
            _sft_step(moved)
        trained = logprobs(moved)
        sampler = moved.save_weights_and_get_sampling_client()
        (second,) = running_resources() - before  # the generator-less one stopped
        assert second != first and generators_of(second) == 1
        sampled = sampler.compute_logprobs(types.ModelInput.from_ints(tokens)).result()
        assert sampled[1:] == pytest.approx(trained, abs=1e-5)
        _sft_step(moved)
        reference = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=5)
        for _ in range(3):
            _sft_step(reference)
        assert logprobs(moved) == pytest.approx(logprobs(reference), abs=1e-6)
    finally:
        moved.close()
        if reference is not None:
            reference.close()
    assert running_resources() == before


def test_clients_created_at_once_share_one_resource(rl_emulator: EmulatorHandle) -> None:
    before = running_resources()
    service_client = tinker.ServiceClient()

    async def open_three() -> list[tinker.TrainingClient]:
        return list(
            await asyncio.gather(
                *(
                    service_client.create_lora_training_client_async(MODEL, rank=4, seed=i)
                    for i in range(3)
                )
            )
        )

    clients = asyncio.run(open_three())
    try:
        assert len(running_resources() - before) == 1
        for client in clients:
            _sft_step(client)
    finally:
        for client in clients:
            client.close()
    assert running_resources() == before


@pytest.mark.training
def test_a_script_says_what_its_resources_cost_and_which_it_leaves_running(
    rl_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    """A script that closes nothing: at exit its own resource is stopped and the cost line
    printed; a borrowed resource (``model_resources_id``) is left running, and said so."""
    with ModelResourcesClient.create(base_model=MODEL, interval=0.1) as borrowed:
        rid = borrowed.model_resources_id
        script = tmp_path / "leaves.py"
        script.write_text(
            textwrap.dedent(
                f"""
                import tgnb.tinker as tinker

                own = tinker.ServiceClient().create_lora_training_client({MODEL!r}, rank=4)
                lent = tinker.ServiceClient(model_resources_id={rid!r})
                lent.create_lora_training_client({MODEL!r}, rank=4)
                print(own.get_info().model_id)
                """
            ),
            encoding="utf-8",
        )
        before = running_resources()
        proc = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        report = [ln for ln in proc.stderr.splitlines() if ln.startswith("tgnb.tinker:")]
        assert len(report) == 3, proc.stderr[-3000:]
        held = [ln for ln in report if "this script held 1 model resource(s)" in ln]
        assert len(held) == 2 and all("about $" in ln for ln in held), report
        assert sum("1 model resource(s), 1 GPU(s): about" in ln for ln in held) == 1  # its own
        assert sum("1 model resource(s), 2 GPU(s): about" in ln for ln in held) == 1  # the lent
        (left,) = [ln for ln in report if "still running" in ln]
        assert rid in left and "borrowed" in left and "$18.00/hour" in left
        assert f"%tg pt stop --resource {rid} --force" in left
        assert running_resources() == before  # the script's own resource stopped at its exit
        assert rid in before
        assert rl_emulator.api_key not in proc.stdout + proc.stderr
        borrowed.stop(force=True)


def test_waiting_for_releases_starts_no_thread_when_nothing_was_released() -> None:
    """A script that dropped no sampler reaches its exit report with no release thread started
    for it (the report waits on that thread when there is one)."""
    probe = textwrap.dedent(
        """
        import threading
        from tgnb.tinker._support import wait_for_releases
        wait_for_releases(timeout=5)
        print([t.name for t in threading.enumerate() if t.name.startswith("tgnb-tinker")])
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr
