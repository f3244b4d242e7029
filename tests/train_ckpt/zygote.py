"""Helper process of the reliability test: pays the torch/TRL import once, then forks one child per
trial. Each child resumes the run in RUN_DIR through the real `CheckpointGuard` (the same writer and
resume path the runner uses: the guard attached to the trainer writes with `tgnb.train.fastsave`),
trains the tiny model with DPO saving at every step, and SIGKILLs itself at a seeded random instant
inside a later save (a real SIGKILL, delivered by a timer thread).

Protocol: one line ``RUN_DIR SEED REPORT_JSON`` on stdin per trial; the zygote answers one line
``ZYGOTE {"status": <waitpid status>}`` on stdout
(other lines there are the run's own records). The child writes REPORT_JSON (``resumed_step``,
``armed_step``, ``delay_s``, ``cost_s``) before it arms the kill.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"

import torch

torch.set_num_threads(1)  # no thread pool alive across fork()

from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import DPOConfig, DPOTrainer  # noqa: E402

from tgnb.train import assets, data  # noqa: E402
from tgnb.train.policy import CheckpointPolicy  # noqa: E402
from tgnb.train.preemption import CheckpointGuard  # noqa: E402
from tgnb.train.record import Recorder  # noqa: E402

MODEL = assets.tiny_path(0)
TOKENIZER = AutoTokenizer.from_pretrained(MODEL)
DATASET = data.load("arithmetic-preference", size=64)


def trial(run_dir: Path, seed: int, report: Path) -> None:
    rng = random.Random(seed)
    policy = CheckpointPolicy(every_steps=1, keep_last=2, watch_drain=False)
    guard = CheckpointGuard(policy, run_dir, Recorder(run_dir))
    info: dict[str, Any] = {"seed": seed}
    arm_after = rng.randint(2, 3)  # completed saves in this child before the kill is armed
    fraction = rng.uniform(0.0, 1.3)

    class Killer(TrainerCallback):
        seen = 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.seen += 1
            if self.seen != arm_after + 1 or guard.checkpoint_cost_s is None:
                return
            delay = fraction * guard.checkpoint_cost_s  # from the save decision, just made
            info.update(armed_step=state.global_step, delay_s=delay, cost_s=guard.checkpoint_cost_s)
            report.write_text(json.dumps(info))
            began = time.monotonic()

            def kill() -> None:
                time.sleep(max(0.0, delay - (time.monotonic() - began)))
                os.kill(os.getpid(), signal.SIGKILL)

            threading.Thread(target=kill, daemon=True).start()

    args = DPOConfig(
        **guard.training_args(
            dict(
                max_steps=10_000,
                per_device_train_batch_size=2,
                learning_rate=1e-3,
                report_to="none",
                use_cpu=True,
                bf16=False,
                seed=0,
                disable_tqdm=True,
                max_length=32,
                logging_strategy="no",
            )
        )
    )
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(MODEL),
        ref_model=AutoModelForCausalLM.from_pretrained(MODEL),
        args=args,
        train_dataset=DATASET,
        processing_class=TOKENIZER,
        callbacks=[*guard.callbacks(), Killer()],
    )
    guard.attach(trainer)  # saves through tgnb.train.fastsave, as the runner's do
    resume = guard.resume_from()
    info["resumed_step"] = guard.resumed_step
    info["resumed_from"] = resume
    report.write_text(json.dumps(info))
    trainer.train(resume_from_checkpoint=resume)
    info["error"] = "training ended without being killed"
    report.write_text(json.dumps(info))


def main() -> None:
    print("ZYGOTE " + json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        run_dir, seed, report = line.split()
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                trial(Path(run_dir), int(seed), Path(report))
            except BaseException as exc:  # report, never return into the zygote's loop
                Path(report).with_suffix(".error").write_text(repr(exc))
                code = 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("ZYGOTE " + json.dumps({"status": status}), flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: library threads may not outlive fork() cleanly
