"""Text progress bars (tqdm) for waits outside a widget front end: a run's optimizer steps with an
ETA (`StepBar`, shown by ``Run.wait()``) and preemptible capacity against its target
(`CapacityBar`, shown by ``%tg scale --wait`` in a terminal IPython).

Both write one line, redrawn in place (``\\r``): to stderr in a terminal or a script (tqdm's
convention, out of a pipe's way), to stdout in a Jupyter kernel, where stderr is drawn as an
error (a pink block in JupyterLab and in an nbconvert HTML export) and progress is not one. An
export reduces the redraws to the last one. tqdm is imported only when a bar is made.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (IPython with a kernel attached)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return getattr(shell, "kernel", None) is not None


def stream() -> TextIO:
    """Where a progress bar writes: stdout in a Jupyter kernel, stderr elsewhere."""
    return sys.stdout if in_kernel() else sys.stderr


def _tqdm(**kwargs: Any) -> Any:
    from tqdm import tqdm

    return tqdm(file=stream(), dynamic_ncols=True, leave=True, **kwargs)


class StepBar:
    """``run grpo-1a2b: 12/30 steps [00:05<00:07, 2.4 step/s] running``: steps done against
    max_steps, elapsed, ETA from the rate seen since the bar started."""

    def __init__(self, name: str, total: int | None, step: int = 0) -> None:
        self._bar = _tqdm(desc=f"run {name}", total=total, initial=step, unit="step")
        self._state = ""

    def update(self, step: int, state: str) -> None:
        """Redraw when the step or the state changed (tqdm redraws at most every 0.1 s)."""
        if state != self._state:
            self._state = state
            self._bar.set_postfix_str(state, refresh=step <= self._bar.n)
        if step > self._bar.n:
            self._bar.update(step - self._bar.n)

    def close(self) -> None:
        self._bar.close()


class CapacityBar:
    """``preemptible GPUs: 8/16 [00:03]``: allocated against the target while a scale waits."""

    def __init__(self, target: int) -> None:
        self._bar = _tqdm(
            desc="preemptible GPUs",
            total=max(target, 0),
            unit="GPU",
            bar_format="{desc}: {bar} {n_fmt}/{total_fmt} allocated [{elapsed}]",
        )

    def update(self, state: Any) -> None:
        """The callback of a capacity wait: show a `ClusterState`'s allocated/desired GPUs."""
        self._bar.total = max(int(state.desired_preemptible_gpus), 0)
        self._bar.n = int(state.allocated_preemptible_gpus)
        self._bar.refresh()

    def close(self) -> None:
        self._bar.close()
