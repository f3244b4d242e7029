"""The tokenizer of a served model loads by the name the emulator lists (issue 23 §2, last point).

A Tinker or TRL user's script as their docs write it: list the supported models (the SDK's
``client.post_training.supported_models.get()``, or Tinker's
``ServiceClient().get_server_capabilities()`` through ``tgnb.tinker``), then
``AutoTokenizer.from_pretrained(name)`` with the name listed, nothing else: no
``local_files_only``, no ``HF_HUB_OFFLINE``. Each runs in a fresh interpreter with every ``HF_*``
and ``TRANSFORMERS_*`` variable unset, against the real emulator daemon over loopback HTTP; one
variant also has a clean ``HOME`` (so an empty Hugging Face cache of its own).

Nothing is faked. This machine has no route to the Hub (no DNS for huggingface.co), which is the
"without network" case; the script records, with a Python audit hook that only observes, every
host name it looks up and every address it connects to, and the test asserts none is off the
loopback (with network the Hub would answer 404 for ``tgnb/tiny-llama``, so no Hub request is
the criterion in both cases). Before the fix the listed name was ``tgnb/tiny-llama`` and the load
looked up huggingface.co and retried for about 50 s here. The times are printed, not asserted:
the first ``from_pretrained`` of a process also pays transformers' one-time imports (its Llama
config module pulls in torch.distributed, accelerate, sympy), as it would for any model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tgnb.emulator.testing import EmulatorHandle

#: Observes (never changes) name lookups and connections, then the user's script runs.
WATCH = textwrap.dedent(
    """
    import json, sys, time
    LOOKUPS, CONNECTS = [], []
    def _watch(event, args):
        if event == "socket.getaddrinfo":
            LOOKUPS.append(str(args[0]))
        elif event == "socket.connect":
            addr = args[1]
            CONNECTS.append(str(addr[0]) if isinstance(addr, tuple) else str(addr))
    sys.addaudithook(_watch)
    """
)

SDK_SCRIPT = textwrap.dedent(
    """
    from together import Together
    from transformers import AutoTokenizer

    client = Together()
    names = [m.base_model for m in client.post_training.supported_models.get().data]
    """
)

TINKER_SCRIPT = textwrap.dedent(
    """
    import tgnb.tinker as tinker
    from transformers import AutoTokenizer

    capabilities = tinker.ServiceClient().get_server_capabilities()
    names = [m.model_name for m in capabilities.supported_models]
    """
)

LOAD = textwrap.dedent(
    """
    LOOKUPS.clear(); CONNECTS.clear()
    t0, c0 = time.monotonic(), time.process_time()
    tokenizer = AutoTokenizer.from_pretrained(names[0])
    t1, c1 = time.monotonic(), time.process_time()
    again = AutoTokenizer.from_pretrained(names[0])
    t2 = time.monotonic()
    ids = tokenizer.encode("1+1=2")
    print(json.dumps({
        "names": names, "first_s": t1 - t0, "first_cpu_s": c1 - c0, "again_s": t2 - t1, "ids": ids,
        "decoded": tokenizer.decode(ids, skip_special_tokens=True),
        "again_ids": again.encode("1+1=2"), "lookups": LOOKUPS, "connects": CONNECTS,
    }))
    """
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _user_env(emu: EmulatorHandle, home: Path | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "TRANSFORMERS_", "HUGGINGFACE_")) and k != "XDG_CACHE_HOME"
    }
    env.update(
        TOGETHER_BASE_URL=emu.base_url,
        TOGETHER_API_KEY=emu.api_key,
        TOGETHER_DISABLE_VERSION_CHECK="1",
        TGNB_HOME=str(emu.home),
    )
    if home is not None:
        env["HOME"] = str(home)
    return env


@pytest.mark.parametrize(
    ("script", "clean_home"),
    [
        pytest.param(SDK_SCRIPT, False, id="sdk"),
        pytest.param(TINKER_SCRIPT, False, id="tinker"),
        pytest.param(TINKER_SCRIPT, True, id="tinker-clean-home"),
    ],
)
def test_listed_name_loads_with_no_hub_call_and_no_env(
    rl_emulator: EmulatorHandle, tmp_path: Path, script: str, clean_home: bool
) -> None:
    home = tmp_path / "home" if clean_home else None
    if home is not None:
        home.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", WATCH + script + LOAD],
        env=_user_env(rl_emulator, home),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    print(
        f"listed {got['names'][0]!r}: from_pretrained {got['first_s']:.3f} s wall, "
        f"{got['first_cpu_s']:.3f} s CPU (first in the process: transformers' own lazy imports), "
        f"{got['again_s']:.3f} s (again)"
    )
    assert got["decoded"] == "1+1=2" and got["ids"] == got["again_ids"]
    off_loopback = [h for h in got["lookups"] + got["connects"] if h not in LOOPBACK]
    assert off_loopback == [], (off_loopback, proc.stderr[-2000:])
    assert "Retrying" not in proc.stderr and "huggingface.co" not in proc.stderr


@pytest.mark.slow
def test_a_checkpoint_under_the_alias_resumes_under_the_listed_name(
    rl_emulator: EmulatorHandle,
) -> None:
    """``tgnb/tiny-llama`` stays accepted (a resource keeps the name it was started with), and it
    is the same model as the listed directory: a training checkpoint taken on a resource started
    as ``tgnb/tiny-llama`` resumes on one started by the listed name (before the listing changed,
    every resource had the alias; a name compared as text would refuse it)."""
    from together import Together
    from together.post_training import AdamParams, ModelResourcesClient, Sample

    listed = Together().post_training.supported_models.get().data[0].base_model
    assert Path(listed).is_dir() and listed != "tgnb/tiny-llama"
    samples = [
        Sample(
            model_input={"chunks": [{"encoded_text": {"tokens": [1, 7, 8, 9]}}]},
            loss_fn_inputs={"target_tokens": [7, 8, 9, 10], "weights": [1.0] * 4},
        )
    ]
    with ModelResourcesClient.create(base_model="tgnb/tiny-llama", interval=0.1) as old:
        sess = old.create_session(lora_config={"rank": 4}, interval=0.1)
        sess.trainer.forward_backward(samples=samples, loss={"type": "cross_entropy"})
        sess.trainer.optim_step(adam_params=AdamParams(learning_rate=0.01))
        ckpt = sess.create_training_checkpoint()
        sess.stop()
    with ModelResourcesClient.create(base_model=listed, interval=0.1) as new:
        resumed = new.create_session(resume_from_checkpoint_id=ckpt.id, interval=0.1)
        info = resumed.retrieve()
        assert info.status == "TRAINING_SESSION_STATUS_RUNNING" and str(info.step) == "1"
        resumed.stop()
