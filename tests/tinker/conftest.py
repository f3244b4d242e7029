"""The Tinker layer's tests run against the emulator's Post-Training API: its fixtures
(tests/emulator/rl/conftest.py)."""

from tests.emulator.rl.conftest import TINY, ce_sample, rl_daemon, rl_emulator, seq, tiny_model

__all__ = ["TINY", "ce_sample", "rl_daemon", "rl_emulator", "seq", "tiny_model"]
