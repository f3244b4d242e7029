"""A stand-in for the runner while it is being written: drives TRL's DPOTrainer/GRPOTrainer with a
`CheckpointGuard` on the built-in tiny assets. Usage: python driver.py RUN_DIR ALGO MAX_STEPS [EVERY]
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(argv: list[str]) -> int:
    run_dir, algo, max_steps = Path(argv[0]), argv[1], int(argv[2])
    every = int(argv[3]) if len(argv) > 3 else None
    from tgnb.train import assets, data
    from tgnb.train.policy import CheckpointPolicy
    from tgnb.train.preemption import CheckpointGuard
    from tgnb.train.record import Recorder

    policy = CheckpointPolicy(every_steps=every, keep_last=2, drain_poll_seconds=0.2)
    guard = CheckpointGuard(policy, run_dir, Recorder(run_dir))
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    torch.use_deterministic_algorithms(True)
    path = assets.tiny_path(0)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    common = dict(
        max_steps=max_steps,
        per_device_train_batch_size=4,
        learning_rate=5e-3,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        disable_tqdm=True,
    )
    rec = guard.recorder

    class Log(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):  # type: ignore[no-untyped-def]
            rec.metric(state.global_step, pid=os.getpid())
            delay = float(os.environ.get("DRIVER_STEP_SLEEP", "0"))
            if delay:
                import time

                time.sleep(delay)

    if algo == "dpo":
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**guard.training_args({**common, "max_length": 32}))
        trainer = DPOTrainer(
            model=model,
            ref_model=AutoModelForCausalLM.from_pretrained(path),
            args=args,
            train_dataset=data.load("arithmetic-preference", size=400),
            processing_class=tok,
            callbacks=[*guard.callbacks(), Log()],
        )
    else:
        from trl import GRPOConfig, GRPOTrainer

        from tgnb.train import rewards

        args = GRPOConfig(
            **guard.training_args(
                {
                    **common,
                    "num_generations": 4,
                    "max_completion_length": 8,
                    "gradient_checkpointing": False,
                }
            )
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[rewards.resolve("correctness")] if hasattr(rewards, "resolve") else [],
            args=args,
            train_dataset=data.load("arithmetic", size=400),
            processing_class=tok,
            callbacks=[*guard.callbacks(), Log()],
        )
    trainer.train(resume_from_checkpoint=guard.resume_from())
    code = guard.finish(trainer)
    if trainer.state.global_step >= max_steps:
        trainer.save_model(str(run_dir / "final"))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
