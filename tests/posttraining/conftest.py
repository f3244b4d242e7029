"""The Post-Training client's tests use the emulator's Post-Training fixtures
(tests/emulator/rl/conftest.py)."""

from tests.emulator.rl.conftest import TINY, ce_sample, rl_daemon, rl_emulator, seq, tiny_model

__all__ = ["TINY", "ce_sample", "rl_daemon", "rl_emulator", "seq", "tiny_model"]
