"""What a run trains on, for both planes: the built-in offline model (`assets`: ``tiny``), the
data sets (`data`: built-in, local files, Hugging Face) and the GRPO rewards (`rewards`).

The self-managed runtime (`tgnb.train`) loads them by name from a run's config; the emulator's
Post-Training engine serves the tiny model; the Post-Training notebooks score with the same
rewards. Light: torch, transformers and datasets are imported inside the functions that need them.
"""
