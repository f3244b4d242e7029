"""The secret scrubber (`tgnb.config`): a leaked fragment of a secret's random part is caught, in a
message as in a run's env or training config, while ordinary text that shares a run of public
words with a key (``tgnb-test-owner/model`` with a ``tgnb-test-...`` key) is neither refused nor
masked. The rule is in `tgnb.config`'s docstring; the fault catalogue's leak cases are in
``tests/catalogue/test_env_secrets.py``. Nothing is faked."""

from __future__ import annotations

import secrets

import pytest

from tgnb.backends.base import RunSpec
from tgnb.config import (
    PIECE_CHARS,
    PREFIX_CHARS,
    Scrubber,
    holds_secret,
    random_part,
    register_secret,
    scrub,
)
from tgnb.errors import ValidationError
from tgnb.runs.spec import check_no_secrets

#: Keys as the test suite makes them (`tgnb.emulator.testing.running_emulator`, the cloud,
#: post-training, notebook and Kubernetes tests).
SUITE_KEYS = [
    "tgnb-test-" + secrets.token_hex(8),
    "tgnb-test-key-5up3r-s3cr3t",
    "tgnb-test-restart-key",
    "tgnb-test-transparent-key",
    "tgnb-fake-key-DO-NOT-LEAK-1234",
    "hf_wire-check-token-value-42",
]
#: Ordinary text, each sharing 8 characters or more with one of `SUITE_KEYS`.
ORDINARY = {
    "model": "tgnb-test-owner/model",
    "dataset": "tgnb-test-owner/no-such-dataset",
    "run_name": "through-restart",
    "note": "a transparent overlay; DO-NOT-LEAK is a label; check-token-value is a step",
}


def test_ordinary_text_sharing_words_with_a_key_is_accepted_and_not_masked() -> None:
    """Reproduction: the old rule (any 8 characters of a key less a head of at most 10) refused
    this config ('tgnb-tes' of ``tgnb-test-restart-key`` in the model id, '-restart' in the run
    name) and masked the words as ``***``."""
    for key in SUITE_KEYS:
        register_secret(key)
    for text in ORDINARY.values():
        assert scrub(text) == text
        assert not holds_secret(text), text
    train = {"model": ORDINARY["model"], "dataset": ORDINARY["dataset"], "trl": dict(ORDINARY)}
    spec = RunSpec(name="through-restart", train=train, env={"WANDB_PROJECT": "tgnb-test"})
    check_no_secrets(spec)  # raises ValidationError on a secret
    assert not holds_secret(dict(ORDINARY))


def test_the_suite_keys_themselves_are_still_refused_and_masked() -> None:
    for key in SUITE_KEYS:
        register_secret(key)
        assert scrub(f"Bearer {key} refused") == "Bearer *** refused"
        assert scrub(f"Bearer {key[:PREFIX_CHARS]}... (cut)") == "Bearer ***... (cut)"
        with pytest.raises(ValidationError, match="training config holds a secret"):
            check_no_secrets(RunSpec(name="r", train={"trl": {"run_name": key}}))


#: Key shapes -> their random part (the pieces come only from it).
RANDOM_PARTS = {
    "tgp_FAKE_SECRET_1234567890abcdefghijklmnopqrstuvwxyz": "1234567890abcdefghijklmnopqrstuvwxyz",
    "tgp_v1_AbCdE-fGh9iJkLmNoPqRsTuVwXyZ0123456789abcdefg": (
        "AbCdE-fGh9iJkLmNoPqRsTuVwXyZ0123456789abcdefg"
    ),
    "tgnb-test-0a1b2c3d4e5f6789": "0a1b2c3d4e5f6789",
    "tgnb-emu-Xk9_QrStuvWXyz0123456789ab": "Xk9_QrStuvWXyz0123456789ab",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEf": "AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEf",
    "sk-live-0123456789abcdef": "0123456789abcdef",
    "tgnb-test-key-5up3r-s3cr3t": "5up3r-s3cr3t",
    "hf_Zx9-this-is-the-token-value": "Zx9",
    "tgnb-test-restart-key": "",
    "correcthorsebatterystaple": "correcthorsebatterystaple",  # 25 letters is no word
    "p@ssw0rd!": "p@ssw0rd",
    "#$%&*!?+": "#$%&*!?+",
}


@pytest.mark.parametrize(("secret", "part"), RANDOM_PARTS.items(), ids=list(RANDOM_PARTS))
def test_random_part(secret: str, part: str) -> None:
    assert random_part(secret) == part


@pytest.mark.parametrize("secret", [k for k, v in RANDOM_PARTS.items() if len(v) >= 20])
def test_every_leak_of_the_random_part_is_masked(secret: str) -> None:
    """Any `PIECE_CHARS` or more characters of the random part, wherever they are cut."""
    reg = Scrubber()
    reg.register(secret)
    part = random_part(secret)
    start = secret.index(part)
    for n in (PIECE_CHARS, 10, 20):
        for i in range(len(part) - n + 1):
            leak = part[i : i + n]
            text = reg.scrub(f"[ {leak} ]")
            assert text == "[ *** ]", (leak, text)
            assert reg.holds({"opts": [f"--x={leak}"]})
    assert reg.scrub(f"'{secret[:PREFIX_CHARS]}'") == "'***'"  # a message cut after the prefix
    cut = reg.scrub(f"'{secret[: start + PIECE_CHARS]}'")  # the public head may stay
    assert cut == f"'{secret[:start]}***'" or cut == "'***'", cut


def test_a_short_run_of_the_random_part_is_not_a_secret() -> None:
    reg = Scrubber()
    reg.register("tgnb-test-0a1b2c3d4e5f6789")
    text = "commit 0a1b2c3 and 4e5f678 (7 characters each), run tgnb-test-owner/model"
    assert reg.scrub(text) == text and not reg.holds(text)


def test_a_secret_of_words_is_masked_whole_and_by_its_prefix_only() -> None:
    reg = Scrubber()
    reg.register("tgnb-test-restart-key")
    assert not reg.pieces
    assert reg.scrub("k=tgnb-test-restart-key; run through-restart") == "k=***; run through-restart"
    assert reg.scrub("k=tgnb-test-rest (cut)") == "k=*** (cut)"


def test_a_secret_sharing_its_prefix_with_a_longer_one_is_masked_whole() -> None:
    """Two registered secrets with the same first characters: the shorter one shown alone is one
    ``***``, not the longer one's prefix mask followed by a mask of the rest."""
    longer, shorter = "tgnb-test-prefix-sharing-0a1b2c3d4e5f", "tgnb-test-prefix-9z8y7x6w"
    register_secret(longer)
    register_secret(shorter)
    assert scrub(f"Bearer {shorter} refused") == "Bearer *** refused"
    assert scrub(f"Bearer {longer} refused") == "Bearer *** refused"
