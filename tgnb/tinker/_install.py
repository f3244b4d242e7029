"""``import tinker`` anywhere in a program resolving to this layer: `install` / `uninstall`.

A recipe whose library modules ``import tinker`` themselves (the cookbook's DPO, chat_sl and
math_rl) has no single import line to change. `install` puts a module named ``tinker`` in
``sys.modules``: the genuine package's namespace (its types, errors, submodules: its
``__path__`` and ``__spec__`` too, so ``import tinker.types`` and
``from tinker.lib... import ...`` load the genuine files) with this layer's clients in place of
Tinker's. It changes nothing in the genuine package itself, and `uninstall` puts it back.

It must run before the modules that ``import tinker`` are imported: first thing in the entry
script (``import tgnb.tinker; tgnb.tinker.install()``), or let ``python -m tgnb.tinker
script.py args...`` / ``python -m tgnb.tinker -m package.module args...`` do it.
"""

from __future__ import annotations

import sys
import types
from typing import Any


def installed() -> bool:
    """Whether ``import tinker`` currently answers this layer."""
    return bool(getattr(sys.modules.get("tinker"), "__tgnb_layer__", False))


def install() -> types.ModuleType:
    """Make ``import tinker`` resolve to this layer for the rest of the process; idempotent.

    Answers the module that ``import tinker`` now gives."""
    import tinker as current

    if installed():
        return current
    from tgnb.tinker._newer import NEWER
    from tgnb.tinker._paths import ParsedCheckpointTinkerPath
    from tgnb.tinker._rest import RestClient
    from tgnb.tinker._sampling import SamplingClient
    from tgnb.tinker._service import ServiceClient
    from tgnb.tinker._support import TINKER_LOSS_DEFAULTS, load_tokenizer
    from tgnb.tinker._training import TrainingClient

    module = types.ModuleType("tinker", "Tinker's namespace with tgnb.tinker's clients.")
    module.__dict__.update(
        {k: v for k, v in current.__dict__.items() if k not in ("__doc__", "__getattr__")}
    )
    module.__dict__.update(
        ServiceClient=ServiceClient,
        TrainingClient=TrainingClient,
        SamplingClient=SamplingClient,
        RestClient=RestClient,
        ParsedCheckpointTinkerPath=ParsedCheckpointTinkerPath,
        load_tokenizer=load_tokenizer,
        TINKER_LOSS_DEFAULTS=TINKER_LOSS_DEFAULTS,
        __tgnb_layer__=True,
        __tgnb_genuine__=current,
    )
    module.__dict__.update({k: v for k, v in NEWER.items() if k not in module.__dict__})
    sys.modules["tinker"] = module
    return module


def uninstall() -> None:
    """Give ``import tinker`` back to the genuine package."""
    module: Any = sys.modules.get("tinker")
    if installed():
        sys.modules["tinker"] = module.__tgnb_genuine__
