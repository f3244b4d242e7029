"""Helper process of the reliability test: pays the torch/TRL import once, then forks one child per
trial. Each child resumes the run in RUN_DIR through the real `CheckpointGuard` (the same writers
and resume path the runner uses), trains the tiny model with DPO and SIGKILLs itself at a seeded
random instant inside a save (a real SIGKILL, delivered by a timer thread). Even seeds save at every
step (`tgnb.train.fastsave`, the Trainer's layout) and are killed inside a later one; odd seeds save
only when preempted: the child sends itself SIGTERM mid-step, and the kill lands inside the express
checkpoint that follows (`tgnb.train.express`, written into the spare).

Protocol: one line ``RUN_DIR SEED REPORT_JSON`` on stdin per trial; the zygote answers one line
``ZYGOTE {"status": <waitpid status>}`` on stdout
(other lines there are the run's own records). The child writes REPORT_JSON (``mode``,
``resumed_step``, ``armed_step``, ``delay_s``, ``cost_s``) before it arms the kill.
"""

from __future__ import annotations

import contextlib
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
from tgnb.train.preemption import CheckpointGuard, Preempted  # noqa: E402
from tgnb.train.record import Recorder  # noqa: E402

MODEL = assets.tiny_path(0)
TOKENIZER = AutoTokenizer.from_pretrained(MODEL)
DATASET = data.load("arithmetic-preference", size=64)


#: The SIGKILL of an express trial lands 0.5x to 1.8x this after its SIGTERM (the tiny model's
#: express checkpoint takes 2-5 ms on this project's machines, from the signal to its marker).
EXPRESS_S = 0.002


def trial(run_dir: Path, seed: int, report: Path) -> None:
    rng = random.Random(seed)
    express = seed % 2 == 1
    policy = CheckpointPolicy(every_steps=0 if express else 1, keep_last=2, watch_drain=False)
    guard = CheckpointGuard(policy, run_dir, Recorder(run_dir))
    info: dict[str, Any] = {"seed": seed, "mode": "express" if express else "periodic"}
    arm_after = rng.randint(2, 3)  # completed steps (and saves) in this child before the kill
    fraction = rng.uniform(0.0, 1.3)
    into_step = rng.uniform(0.001, 0.006)

    class Preempter(TrainerCallback):
        """SIGTERM mid-step, then SIGKILL inside the express checkpoint it starts."""

        seen = 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.seen += 1
            if self.seen != arm_after + 1:
                return
            delay = (0.5 + fraction) * EXPRESS_S  # 1 to 3.6 ms after the SIGTERM
            info.update(armed_step=state.global_step, delay_s=delay, into_step_s=into_step)
            report.write_text(json.dumps(info))

            def preempt() -> None:
                time.sleep(into_step)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(delay)
                os.kill(os.getpid(), signal.SIGKILL)

            threading.Thread(target=preempt, daemon=True).start()

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
        callbacks=[*guard.callbacks(), Preempter() if express else Killer()],
    )
    guard.attach(trainer)  # saves as the runner's do: fastsave at boundaries, express on preemption
    resume = guard.resume_from()
    info["resumed_step"] = guard.resumed_step
    info["resumed_from"] = resume
    report.write_text(json.dumps(info))
    with contextlib.suppress(Preempted):
        trainer.train(resume_from_checkpoint=resume)
    if express:  # the checkpoint may be complete before the kill lands: wait for it
        time.sleep(30)
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
