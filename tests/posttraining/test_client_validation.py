"""The Post-Training client's checks before any request, and its views of the API's records
(parsed from JSON shaped as the reference says, through the SDK's own response models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tgnb.errors import ValidationError
from tgnb.posttraining import validate as v
from tgnb.posttraining.records import ModelInfo, ResourceInfo, SessionInfo


@pytest.mark.parametrize(
    ("lora", "match"),
    [
        # a rank's range is the model's, the service's to check (test_client_e2e, test_pt_wording)
        ({"rank": "8"}, "LoRA rank must be a whole number"),
        ({"rank": 8.0}, "LoRA rank must be a whole number"),
        ({"rank": 8, "alpah": 16}, "unknown LoRA key 'alpah'"),
        ({"alpha": -1}, "alpha -1 must be > 0"),
        ({"alpha": "16"}, "LoRA alpha must be a number, got '16': try alpha=16"),
        ({"alpha": True}, "LoRA alpha must be a number"),
        ({"dropout": 1.5}, r"dropout 1.5 must be in \[0, 1\)"),
        ({"train_unembed": "yes"}, "train_unembed must be True or False"),
        ([8], "lora must be a dict"),
    ],
)
def test_bad_lora_configs_name_the_fix(lora: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        v.check_lora(lora)


def test_good_lora_config_is_the_sdk_shape() -> None:
    assert v.check_lora({"rank": 8, "alpha": 16, "dropout": 0, "seed": 3}) == {
        "rank": 8,
        "alpha": 16,
        "dropout": 0.0,
        "seed": 3,
    }
    assert v.check_lora(None) is None
    # what only the service knows is sent as given; alpha is a float too, as the service takes
    assert v.check_lora({"rank": 4096, "alpha": 12.5}) == {"rank": 4096, "alpha": 12.5}


@pytest.mark.parametrize(
    ("fn", "value", "match"),
    [
        (v.check_generators, -1, "generators=-1 is out of range"),
        (v.check_generators, 99, "out of range"),
        (v.check_generators, 1.5, "generators must be a whole number"),
        (v.check_inactive_timeout, 10, "inactive_timeout=10 is out of range: use 300 to 86400"),
        (v.check_name, "has space", "session name 'has space' is not valid"),
        (v.check_name, "x" * 65, "is not valid"),
        (v.check_variant, "lora", "checkpoint variant 'lora' is not known: use 'adapter'"),
        (v.check_base_model, "", "is not a model name"),
        (v.check_base_model, "two words", "is not a model name"),
        (v.check_id, "a/b", "is not an id"),
    ],
)
def test_bad_values_raise_a_validation_error(fn: Any, value: Any, match: str) -> None:
    with pytest.raises(ValidationError, match=match):
        if fn is v.check_id:
            fn(value, "resource id", "pt.resources() lists them")
        else:
            fn(value)


def test_variants_map_to_the_api_names() -> None:
    assert v.check_variant("adapter") == "CHECKPOINT_VARIANT_ADAPTER"
    assert v.check_variant("MERGED") == "CHECKPOINT_VARIANT_MERGED"
    assert v.check_variant("CHECKPOINT_VARIANT_ADAPTER") == "CHECKPOINT_VARIANT_ADAPTER"


def test_out_dir_may_not_be_a_file(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(ValidationError, match="is a file"):
        v.check_out_dir(f)
    assert v.check_out_dir(tmp_path / "new") == tmp_path / "new"


def test_metrics_must_be_finite_numbers() -> None:
    assert v.check_metrics({"reward_mean": 1}) == {"reward_mean": 1.0}
    with pytest.raises(ValidationError, match="not finite"):
        v.check_metrics({"reward_mean": float("nan")})
    with pytest.raises(ValidationError, match="not a number"):
        v.check_metrics({"reward_mean": "high"})
    with pytest.raises(ValidationError, match="at least one metric"):
        v.check_metrics({})


def test_records_parse_the_sdk_models() -> None:
    from together.types.post_training import ModelResources, RlSupportedModels, Session

    r = ModelResources.model_validate(
        {
            "id": "mr-1",
            "base_model": "tgnb/tiny-llama",
            "compute_config": {"gpu_type": "B200-SXM", "num_generator_replicas": 1},
            "created_at": "2026-11-30T20:00:00Z",
            "updated_at": "2026-11-30T20:00:05Z",
            "created_by": "u",
            "inactive_timeout": 900,
            "lora_enabled": True,
            "optimizer_config": {"adam": {}},
            "status": "MODEL_RESOURCES_STATUS_PENDING",
            "status_details": {"queue_position": 2},
        }
    )
    info = ResourceInfo.from_sdk(r)
    assert (info.status, info.generators, info.queue_position, info.active) == (
        "PENDING",
        1,
        2,
        True,
    )
    s = Session.model_validate(
        {
            "id": "ts-1",
            "base_model": "tgnb/tiny-llama",
            "model_resources_id": "mr-1",
            "created_at": "2026-11-30T20:00:10Z",
            "updated_at": "2026-11-30T20:01:10Z",
            "created_by": "u",
            "status": "TRAINING_SESSION_STATUS_RUNNING",
            "step": "7",
            "metadata": {},
            "display_name": "lr-1e-4",
            "policy_state": {
                "applied_weights_version": "3",
                "target_weights_version": "3",
                "trainer_step": "7",
                "pending_publish": False,
            },
            "training_checkpoints": [
                {"id": "ck-t", "created_at": "2026-11-30T20:01:00Z", "step": "5"}
            ],
            "inference_checkpoints": [
                {"id": "ck-i", "created_at": "2026-11-30T20:01:05Z", "step": "7"}
            ],
            "lora_config": {"rank": 8, "alpha": 16},
        }
    )
    si = SessionInfo.from_sdk(s)
    assert (si.step, si.policy_version, si.lora_rank, si.label, si.resource_id) == (
        7,
        3,
        8,
        "lr-1e-4",
        "mr-1",
    )
    assert [(c.id, c.kind, c.step) for c in si.checkpoints] == [
        ("ck-t", "training", 5),
        ("ck-i", "inference", 7),
    ]
    models = RlSupportedModels.model_validate(
        {
            "data": [
                {
                    "base_model": "tgnb/tiny-llama",
                    "default_gpu_type": "B200-SXM",
                    "compute_configs": [
                        {
                            "gpu_type": "B200-SXM",
                            "trainer_config": {
                                "lora": {
                                    "max_batch_size": 64,
                                    "max_rank": 64,
                                    "max_seq_length": 512,
                                }
                            },
                        }
                    ],
                }
            ]
        }
    )
    m = ModelInfo.from_sdk(models.data[0])
    assert (m.name, m.lora, m.full, m.max_lora_rank, m.max_seq_length) == (
        "tgnb/tiny-llama",
        True,
        False,
        64,
        512,
    )


def test_post_training_is_lazy_and_light() -> None:
    import subprocess
    import sys

    code = (
        "import sys, tgnb, tgnb.posttraining; tgnb.post_training; "
        "print(any(m.startswith('together.post_training') for m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
