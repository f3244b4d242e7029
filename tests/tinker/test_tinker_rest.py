"""Tinker's checkpoint paths and ``RestClient``, as Tinker's docs ("Saving and loading",
"Downloading weights") and the cookbook's ``weights`` module use them, on the emulator's
Post-Training API over real HTTP. Nothing is faked."""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path

import pytest
import together

from tgnb.emulator.testing import EmulatorHandle

pytest.importorskip("tinker", reason="the tinker extra: pip install '.[tinker]'")
import tgnb.tinker as tinker  # the one line that differs from a Tinker script
from tests.tinker.test_tinker_layer import EXAMPLES, MODEL, _sft_step, adapter_logprobs
from tests.tinker.test_tinker_layer import process_example as datum_of

types = tinker.types

#: Tinker's name for the output layer's LoRA (the cookbook's weights tools map it to ``lm_head``).
_UNEMBED = "base_model.model.model.unembed_tokens."


def _tinker_to_hf(adapter: Path, out: Path) -> set[str]:
    """Tinker's adapter in `adapter` written into `out` under the HF model's names (the
    cookbook's ``model.unembed_tokens`` -> ``lm_head``), loadable with peft; answers the
    renamed keys, and checks no key has the HF name already."""
    import json

    from safetensors.torch import load_file, save_file

    state = load_file(str(adapter / "adapter_model.safetensors"))
    assert not [k for k in state if "lm_head" in k]
    renamed = {k.replace(_UNEMBED, "base_model.model.lm_head."): v for k, v in state.items()}
    out.mkdir()
    save_file(renamed, str(out / "adapter_model.safetensors"))
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["target_modules"] = ["lm_head" if m == "unembed_tokens" else m
                                for m in config["target_modules"]]  # fmt: skip
    (out / "adapter_config.json").write_text(json.dumps(config))
    return {k for k in state if k.startswith(_UNEMBED)}


def test_tinker_paths_round_trip_and_the_rest_client_downloads(
    rl_emulator: EmulatorHandle, tmp_path: Path
) -> None:
    service_client = tinker.ServiceClient()
    training_client = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=2)
    sampler = None
    try:
        tokenizer = training_client.get_tokenizer()
        data = [datum_of(p, c, tokenizer) for p, c in EXAMPLES]
        _sft_step(training_client, data)
        run_id = training_client.get_info().model_id
        state_path = training_client.save_state("step-1").result().path
        sampler_path = training_client.save_weights_for_sampler("step-1").result().path
        parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(sampler_path)
        assert (parsed.training_run_id, parsed.checkpoint_type) == (run_id, "sampler")
        assert state_path.startswith(f"tinker://{run_id}/weights/")

        # the paths go back in: load_state, and a sampler on the saved weights
        training_client.load_state(state_path).result()
        sampler = service_client.create_sampling_client(model_path=sampler_path)
        prompt = types.ModelInput.from_ints(tokenizer.encode(EXAMPLES[0][0] + EXAMPLES[0][1]))
        sampled = sampler.compute_logprobs(prompt).result()

        rest_client = service_client.create_rest_client()
        listed = rest_client.list_checkpoints(run_id).result().checkpoints
        assert {state_path, sampler_path} <= {c.tinker_path for c in listed}
        assert {c.checkpoint_type for c in listed} == {"training", "sampler"}
        everyone = rest_client.list_user_checkpoints().result().checkpoints
        assert [c.time for c in everyone] == sorted((c.time for c in everyone), reverse=True)
        second = rest_client.list_user_checkpoints(limit=1, offset=1).result().checkpoints
        assert [c.tinker_path for c in second] == [everyone[1].tinker_path]
        with pytest.raises(together.NotFoundError):  # an unknown run is not an empty list
            rest_client.list_checkpoints(str(uuid.uuid4()))

        # tinker 0.38's training-run calls, over the session that is the run
        training_run = rest_client.get_training_run(run_id).result()
        assert (training_run.training_run_id, training_run.base_model) == (run_id, MODEL)
        assert training_run.is_lora and training_run.lora_rank == 4
        newest = {
            k: next(c for c in listed if c.checkpoint_type == k) for k in ("training", "sampler")
        }
        assert training_run.last_checkpoint == newest["training"]  # the run's newest of each kind
        assert training_run.last_sampler_checkpoint == newest["sampler"]
        by_path = rest_client.get_training_run_by_tinker_path(sampler_path).result()
        assert by_path.training_run_id == run_id
        runs = rest_client.list_training_runs(limit=100).result()
        assert run_id in {r.training_run_id for r in runs.training_runs}
        assert runs.cursor.total_count >= len(runs.training_runs) >= 1
        info = rest_client.get_weights_info_by_tinker_path(sampler_path).result()
        assert (info.base_model, info.is_lora, info.lora_rank) == (MODEL, True, 4)
        capabilities = rest_client.get_server_capabilities().result()
        assert capabilities == service_client.get_server_capabilities()
        assert capabilities.supported_models
        external = training_client.save_weights_external("step-1").result().path  # Tinker 0.38
        parsed = tinker.ParsedCheckpointTinkerPath.from_tinker_path(external)
        assert parsed.checkpoint_type == "external"
        urls = rest_client.get_external_weights_urls(external).result().urls
        assert sorted(urls) == ["adapter_config.json", "adapter_model.safetensors"], urls
        for name, url in urls.items():  # as the cookbook's weights.download fetches them
            urllib.request.urlretrieve(url, str(tmp_path / name))
        # Tinker's layout (train_unembed=True, the default): the output layer's LoRA is
        # unembed_tokens; the cookbook maps it back onto the HF model's lm_head, as here
        hf = tmp_path / "hf"
        assert _tinker_to_hf(tmp_path, hf) == {f"{_UNEMBED}lora_{ab}.weight" for ab in "AB"}
        got = adapter_logprobs(hf, prompt.to_ints())
        assert got == pytest.approx(sampled[1:], abs=1e-5)  # the bytes are the sampled weights

        with pytest.warns(UserWarning, match="ignores ttl_seconds: Post-Training checkpoints"):
            assert (
                rest_client.set_checkpoint_ttl_from_tinker_path(sampler_path, 3600).result() is None
            )
        rest_client.set_checkpoint_ttl_from_tinker_path(sampler_path, None).result()
        missing = f"tinker://{run_id}/sampler_weights/{uuid.uuid4()}"
        with pytest.raises(together.NotFoundError):  # a TTL does not skip the path's check
            rest_client.set_checkpoint_ttl_from_tinker_path(missing, 60)
        with pytest.raises(NotImplementedError, match="cannot encrypt"):
            training_client.save_weights_external("x", age_encryption_recipients=["age1xyz"])
        with pytest.raises(NotImplementedError, match="downloads sampler weights only"):
            rest_client.get_external_weights_urls(state_path)
    finally:
        if sampler is not None:
            sampler.close()
        training_client.close()
