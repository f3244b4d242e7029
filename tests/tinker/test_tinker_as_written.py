"""Tinker code as Tinker's users write it, with only the import changed, on the emulator daemon
over real HTTP (the ``rl_emulator`` fixture; nothing faked):

- ``async def`` code that makes synchronous calls inside its running loop (the docs' pipeline
  pattern; the cookbook's ``rl/train.py``: periodic saves, then a sampler on the saved path made
  with the *sync* ``create_sampling_client``, and off-policy rollouts): they work, with Tinker's
  warning where Tinker gives one;
- a program whose own library module does ``import tinker`` (as the cookbook's DPO / chat_sl /
  math_rl recipes do), run with ``python -m tgnb.tinker`` or ``tgnb.tinker.install()``.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker  # the one line that differs from a Tinker script

from .test_tinker_layer import EXAMPLES
from .test_tinker_layer import process_example as datum
from .test_tinker_resources import running_resources

types = tinker.types
MODEL = "tgnb/tiny-llama"
TINKER_WARNING = "Synchronous method '{}()' called from async context."  # as tinker words it


def warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "called from async context" in r.message]


def test_docs_async_pipeline_with_sync_calls_inside_the_loop(
    rl_emulator: EmulatorHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """The docs' pipeline pattern (submit step k+1 before awaiting step k), with the sync calls
    Tinker's tutorials make inside ``async def main()``: ``get_tokenizer()`` (of a training and
    of a sampling client), ``.result()``, ``forward()``, ``create_sampling_client()``. Each works; the calls that wait for a result
    log Tinker's warning, the ones that only submit do not; the loop itself keeps running
    (a task scheduled on it before the calls has run by the end)."""
    caplog.set_level(logging.WARNING, logger="tgnb.tinker")

    async def main() -> dict[str, Any]:
        ticks: list[int] = []

        async def ticker() -> None:
            while True:
                ticks.append(1)
                await asyncio.sleep(0)

        tick_task = asyncio.create_task(ticker())
        service_client = tinker.ServiceClient()
        training_client = await service_client.create_lora_training_client_async(
            base_model=MODEL, rank=8, seed=0
        )
        try:
            tokenizer = training_client.get_tokenizer()  # sync, inside the loop
            data = [datum(p, c, tokenizer) for p, c in EXAMPLES]
            adam = types.AdamParams(learning_rate=3e-3)
            losses = []
            fwd = await training_client.forward_backward_async(data, "cross_entropy")
            opt = await training_client.optim_step_async(adam)
            for _ in range(4):
                next_fwd = await training_client.forward_backward_async(data, "cross_entropy")
                next_opt = await training_client.optim_step_async(adam)
                losses.append((await fwd.result_async()).metrics["loss:sum"])
                await opt
                fwd, opt = next_fwd, next_opt
            losses.append(fwd.result().metrics["loss:sum"])  # sync .result(), inside the loop
            opt.result()
            caplog.clear()
            scored = training_client.forward(data, "cross_entropy")  # a submission: no warning
            assert warned(caplog) == []
            path = training_client.save_weights_for_sampler("step-5").result().path
            sampler = training_client.create_sampling_client(path)  # sync, inside the loop
            try:
                prompt = types.ModelInput.from_ints(tokenizer.encode(EXAMPLES[0][0]))
                params = types.SamplingParams(max_tokens=4, temperature=0.0)
                sampled = sampler.sample(prompt, 1, params).result()
                assert sampler.get_tokenizer().encode("ab") == tokenizer.encode("ab")  # sync
                info = training_client.get_info()
            finally:
                await sampler.close_async()
            return {
                "losses": losses,
                "scored": await scored,
                "sampled": sampled,
                "info": info,
                "ticked": bool(ticks),
            }
        finally:
            await training_client.close_async()
            tick_task.cancel()

    out = asyncio.run(main())
    assert out["losses"][-1] < out["losses"][0], out["losses"]
    assert len(out["scored"].loss_fn_outputs) == len(EXAMPLES)
    assert len(out["sampled"].sequences[0].tokens) >= 1
    assert out["info"].model_name == MODEL and out["ticked"]
    messages = warned(caplog)
    for label in ("APIFuture.result", "TrainingClient.create_sampling_client"):
        assert any(TINKER_WARNING.format(label) in m for m in messages), (label, messages)
    assert any(TINKER_WARNING.format("TrainingClient.get_info") in m for m in messages)
    assert any(TINKER_WARNING.format("SamplingClient.get_base_model") in m for m in messages)


def test_cookbook_rl_train_pattern_periodic_saves_and_off_policy(
    rl_emulator: EmulatorHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """The shape of the cookbook's ``rl/train.py`` async training: a rollout worker and a
    training loop on one event loop, rollouts up to ``max_steps_off_policy=1`` versions behind,
    the importance-sampling loss on the sampler's logprobs, and every ``save_every=2`` steps a
    periodic save (``save_state_async`` + ``save_weights_for_sampler_async``) followed by the
    *sync* ``training_client.create_sampling_client(sampler_path)`` the trainer calls there
    (else ``save_weights_and_get_sampling_client_async``). It runs to the end: every step
    trains on rollouts of the version it allows, and each periodic sampler is on its step."""
    caplog.set_level(logging.WARNING, logger="tgnb.tinker")
    steps, save_every, max_off_policy = 4, 2, 1

    async def main() -> dict[str, Any]:
        service_client = tinker.ServiceClient()
        training_client = await service_client.create_lora_training_client_async(
            base_model=MODEL, rank=8, seed=1
        )
        tokenizer = training_client.get_tokenizer()
        prompt_tokens = tokenizer.encode("English: hello\nPig Latin:")
        prompt = types.ModelInput.from_ints(prompt_tokens)
        params = types.SamplingParams(max_tokens=4, temperature=1.0)
        queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue(maxsize=2)
        current: dict[str, Any] = {
            "version": 0,
            "sampler": await training_client.save_weights_and_get_sampling_client_async(),
        }
        owned: list[Any] = []
        used_versions: list[tuple[int, int]] = []
        saved: list[dict[str, str]] = []

        async def rollout_worker() -> None:
            while True:
                version, sampler = current["version"], current["sampler"]
                result = await sampler.sample_async(prompt, 2, params)
                await queue.put((version, result))

        async def training_loop() -> None:
            for step in range(steps):
                while True:
                    version, result = await queue.get()
                    if step - version <= max_off_policy:  # the trainer drops staler groups
                        break
                used_versions.append((step, version))
                data = []
                for seq in result.sequences:
                    tokens = prompt_tokens + list(seq.tokens)
                    n = len(prompt_tokens)
                    advantage = 1.0 if tokenizer.decode(seq.tokens).startswith(" e") else -0.1
                    data.append(
                        types.Datum(
                            model_input=types.ModelInput.from_ints(tokens[:-1]),
                            loss_fn_inputs={
                                "target_tokens": tokens[1:],
                                "logprobs": [0.0] * (n - 1) + list(seq.logprobs),
                                "advantages": [0.0] * (n - 1) + [advantage] * len(seq.tokens),
                            },
                        )
                    )
                fwd = await training_client.forward_backward_async(data, "importance_sampling")
                opt = await training_client.optim_step_async(types.AdamParams(learning_rate=1e-3))
                await fwd.result_async()
                await opt.result_async()
                if (step + 1) % save_every == 0:  # checkpoint_utils.save_checkpoint_async
                    futures = {
                        "state_path": await training_client.save_state_async(f"{step:06d}"),
                        "sampler_path": await training_client.save_weights_for_sampler_async(
                            f"{step:06d}"
                        ),
                    }
                    paths = {k: (await f.result_async()).path for k, f in futures.items()}
                    saved.append(paths)
                    sampler = training_client.create_sampling_client(paths["sampler_path"])
                    owned.append(sampler)
                else:
                    sampler = await training_client.save_weights_and_get_sampling_client_async()
                current.update(version=step + 1, sampler=sampler)

        worker = asyncio.create_task(rollout_worker())
        try:
            await training_loop()
        finally:
            worker.cancel()
            await asyncio.gather(worker, return_exceptions=True)
            for s in owned:
                await s.close_async()
            await training_client.close_async()
        return {"used": used_versions, "saved": saved}

    out = asyncio.run(main())
    assert [s for s, _ in out["used"]] == list(range(steps))
    assert all(0 <= s - v <= max_off_policy for s, v in out["used"]), out["used"]
    assert len(out["saved"]) == steps // save_every
    checkpoints = rl_emulator.client().post_training.checkpoints
    for i, paths in enumerate(out["saved"]):
        step = (i + 1) * save_every
        for path in paths.values():
            assert int(checkpoints.retrieve(path.rsplit("/", 1)[-1]).step) == step
    messages = warned(caplog)
    assert any(
        TINKER_WARNING.format("TrainingClient.create_sampling_client") in m for m in messages
    )


def test_tinker_038_shape_as_the_cookbook_writes_it(rl_emulator: EmulatorHandle) -> None:
    """Since Tinker 0.38 (tinker-cookbook 0.6's ``supervised/train.py``): ``with
    ServiceClient(..., display_name=...) as service_client:`` and ``await
    service_client.create_lora_training_client(...)`` (a future of the client that is also the
    client; ``.result()`` answers it too). The clients work, and leaving the block closes what it
    opened: the resources it provisioned stop. Samples answer Tinker 0.38's ``sequence_id``
    (``None``: Post-Training names no sequence, so the cookbook 0.6's ``rl/data_processing.py``
    attaches no provenance), futures have ``.coroutine()``, ``record_stability_info=True`` (for
    Tinker's ``stable_reinforce``, not served) is refused, and Tinker 0.38's provenance span
    classes exist, checked as Tinker checks them."""
    before = running_resources()
    span = tinker.SampledProvenanceSpan(sequence_id="s", length=2)
    assert (span.offset, span.length) == (0, 2)
    with pytest.raises(ValueError, match="length must be >= 0"):
        tinker.PromptProvenanceSpan(sequence_id="s", length=-1)

    async def main() -> tuple[set[str], list[float]]:
        with tinker.ServiceClient(user_metadata={"k": "v"}, display_name="sl-run") as service:
            assert service.display_name == "sl-run"
            training_client = await service.create_lora_training_client(
                base_model=MODEL, rank=4, seed=0
            )
            assert training_client.result() is training_client
            assert await training_client.result_async() is training_client
            tokenizer = await asyncio.to_thread(training_client.get_tokenizer)
            data = [datum(p, c, tokenizer) for p, c in EXAMPLES]
            losses = []
            for _ in range(3):
                fwd = await training_client.forward_backward_async(data, "cross_entropy")
                await training_client.optim_step_async(types.AdamParams(learning_rate=3e-3))
                losses.append((await fwd).metrics["loss:sum"])
            sampler = await service.create_sampling_client(base_model=MODEL)
            assert sampler.result() is sampler
            prompt = types.ModelInput.from_ints(tokenizer.encode("English: hi\nPig Latin:"))
            params = types.SamplingParams(max_tokens=3, stop=[tokenizer.eos_token_id])
            sampled = [
                await sampler.sample_async(prompt, 2, params),
                await sampler.sample(prompt, 1, types.SamplingParams(max_tokens=3)).coroutine(),
            ]
            with pytest.raises(NotImplementedError, match="loss_fn='importance_sampling'"):
                service.create_sampling_client(base_model=MODEL, record_stability_info=True)
            seqs = [seq for response in sampled for seq in response.sequences]
            assert len(seqs) == 3 and all(seq.sequence_id is None for seq in seqs), seqs
            return running_resources() - before, losses

    during, losses = asyncio.run(main())
    assert during and losses[-1] < losses[0], (during, losses)
    assert running_resources() == before


LIBRARY = '''
"""A recipe's library module: it imports tinker itself, as the cookbook's do."""
import tinker
from tinker import types


def train(base_model: str, steps: int) -> list[float]:
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=base_model, rank=4)
    tokenizer = training_client.get_tokenizer()
    tokens = tokenizer.encode("English: hello\\nPig Latin: ello-hay\\n")
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    losses = []
    for _ in range(steps):
        fwd = training_client.forward_backward([datum], "cross_entropy")
        training_client.optim_step(tinker.AdamParams(learning_rate=3e-3)).result()
        losses.append(fwd.result().metrics["loss:sum"])
    training_client.close()
    return losses
'''

ENTRY = """
{first_line}
import sys

from recipe import lib

losses = lib.train(sys.argv[1], int(sys.argv[2]))
print("tinker is", lib.tinker.ServiceClient.__module__)
print("learned", losses[-1] < losses[0], losses)
"""


RUNS = {  # the command line, and the entry script's first line
    "python -m tgnb.tinker train.py": (["-m", "tgnb.tinker", "train.py"], ""),
    "python -m tgnb.tinker -m recipe.train": (["-m", "tgnb.tinker", "-m", "recipe.train"], ""),
    "tgnb.tinker.install() in train.py": (
        ["train.py"],
        "import tgnb.tinker; tgnb.tinker.install()",
    ),
}


@pytest.mark.parametrize("how", list(RUNS))
def test_a_program_whose_own_modules_import_tinker(
    rl_emulator: EmulatorHandle, tmp_path: Path, how: str
) -> None:
    """A folder of its own: ``recipe/lib.py`` does ``import tinker``; the entry script (a file,
    or a module run with ``-m``) imports it. One line runs it on Post-Training, with no change
    to ``lib.py``."""
    (tmp_path / "recipe").mkdir()
    (tmp_path / "recipe" / "__init__.py").write_text("")
    (tmp_path / "recipe" / "lib.py").write_text(LIBRARY)
    args, first = RUNS[how]
    entry = textwrap.dedent(ENTRY.format(first_line=first))
    (tmp_path / "train.py").write_text(entry)
    (tmp_path / "recipe" / "train.py").write_text(entry)
    proc = subprocess.run(
        [sys.executable, *args, MODEL, "6"],  # 3 steps once ended no lower than the first (CI)
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "tinker is tgnb.tinker._service" in proc.stdout, proc.stdout
    assert "learned True" in proc.stdout, proc.stdout[-600:]


def test_install_answers_the_layer_and_gives_tinker_back() -> None:
    import tinker as before

    assert not tinker.installed()
    module = tinker.install()
    try:
        import tinker as now
        import tinker.types as now_types

        assert now is module and tinker.install() is module  # idempotent
        assert now.ServiceClient is tinker.ServiceClient and now.Datum is types.Datum
        assert now_types is types and now.TinkerError is before.TinkerError
        assert now.SampledProvenanceSpan is tinker.SampledProvenanceSpan
    finally:
        tinker.uninstall()
    import tinker as after

    assert after is before and not tinker.installed()


def test_python_m_tgnb_tinker_without_a_script_says_how() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tgnb.tinker"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and "usage: python -m tgnb.tinker SCRIPT.py" in proc.stderr
