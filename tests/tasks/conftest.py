"""The tasks' tests (built-in assets, data sets, rewards) share the training runtime's set-up:
offline Hugging Face and a private TGNB_HOME per session (tests/train/conftest.py)."""

from tests.train.conftest import tgnb_home

__all__ = ["tgnb_home"]
