"""What a run trains and how, for every plane: its config (`config.TrainConfig` with its
``checkpoint:`` section, `tgnb.runs.policy.CheckpointPolicy`), the built-in offline model (`assets`:
``tiny``), the data sets (`data`: built-in, local files, Hugging Face) and the GRPO rewards
(`rewards`).

The session and the notebook check a config here before a run is recorded; the on-node runtime
(`tgnb.train`) loads and runs it; the emulator's Post-Training engine serves the tiny model; the
Post-Training notebooks score with the same rewards. Light: torch, transformers and datasets are
imported inside the functions that need them.
"""
