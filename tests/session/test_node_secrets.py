"""Secrets on the node, on the local engine: real emulator over HTTP, the real supervisor, the
user's script in its own process.

- the node gets the run's declared ``secrets`` and none of the kernel's undeclared ones (its
  ``WANDB_API_KEY``, ``AWS_SECRET_ACCESS_KEY``), as Slurm and Kubernetes pass only the declared;
- a failure whose line holds the declared token is stored masked where it is written: the
  ``RunExited`` in ``events.jsonl`` (on Slurm and Kubernetes that file is on shared storage) and
  the traceback in ``train.log``, not only where `Run.error` shows it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tgnb.events import RUN_EXITED
from tgnb.runs.recovery import RecoveryPolicy
from tgnb.runs.spec import JobState, SecretRef
from tgnb.session import Session

TOKEN = "hf_q7ZtXw3Kp9LmN2vB8cR4sD6fG1hJ5kY0"  # made up; declared by reference
UNDECLARED = {
    "WANDB_API_KEY": "wb0123456789abcdef0123456789abcdef01234567",
    "AWS_SECRET_ACCESS_KEY": "aws9Zx8Yw7Vu6Ts5Rq4Po3Nm2Lk1Jh0Gf",
}
SCRIPT = """\
import os
seen = sorted(k for k in ("HF_TOKEN", "WANDB_API_KEY", "AWS_SECRET_ACCESS_KEY") if k in os.environ)
print("node env:", ",".join(seen), flush=True)
raise RuntimeError(f"401 Unauthorized for token {os.environ['HF_TOKEN']}: check it")
"""


@pytest.mark.slow
def test_the_node_gets_declared_secrets_only_and_stores_a_failure_masked(
    session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    for name, value in UNDECLARED.items():
        monkeypatch.setenv(name, value)
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "fails.py").write_text(SCRIPT)
    run = session.launch(
        "fails.py",
        workdir=wd,
        name="token-fails",
        secrets={"HF_TOKEN": SecretRef(name="hf", env="HF_TOKEN")},
        recovery=RecoveryPolicy(max_restarts=0),
    )
    status = run.wait(timeout=180, progress=False)
    assert status.state is JobState.FAILED, run.logs()[-20:]
    assert "node env: HF_TOKEN" in run.logs()  # declared: passed; the kernel's others: not
    run_dir = Path(run.run_dir or "")
    stored = b"".join(p.read_bytes() for p in run_dir.rglob("*") if p.is_file())
    for value in (TOKEN, *UNDECLARED.values()):
        assert value[:12].encode() not in stored  # not whole, nor its head
    (exited,) = [e for e in run.run_events() if e.reason == RUN_EXITED]
    assert exited.message == "failed: RuntimeError: 401 Unauthorized for token ***: check it"
    assert "RuntimeError: 401 Unauthorized for token ***: check it" in run.logs()
    assert run.error() == "RuntimeError: 401 Unauthorized for token ***: check it"
