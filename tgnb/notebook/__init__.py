"""tgnb.notebook: the notebook surface over `tgnb.Session` and `tgnb.runs.Run`.

- `magics`: ``%load_ext tgnb`` registers ``%tg``/``%%tg`` (settings: ``%config Tg.*``);
- `timeline`: `EventTimeline`, nodes, drain windows and runs on one time axis (static SVG);
- `widgets`: `ClusterPanel` and `RunPanel`, live panels with a static HTML rendering;
- `cost`: GPU-hours on standard and preemptible nodes and the work lost to preemptions.

Names are imported on first use, so ``import tgnb.notebook`` loads neither ipywidgets nor IPython.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "EventTimeline": "tgnb.notebook.timeline",
    "timeline": "tgnb.notebook.timeline",
    "ClusterPanel": "tgnb.notebook.widgets",
    "RunPanel": "tgnb.notebook.widgets",
    "CostReport": "tgnb.notebook.cost",
    "Tg": "tgnb.notebook.magics",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tgnb.notebook' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = sorted(_LAZY)
