"""tgnb.server: the jupyter-server extension behind the JupyterLab sidebar.

Enabled by ``jupyter_server_config.d/tgnb.json`` (installed with the wheel), it serves the HTTP API
of `tgnb.server.handlers` under ``<base_url>/tgnb/`` on one `Session` per server, attached lazily
(with no ``TOGETHER_API_KEY``: the local emulator). The API key stays in the server process.

Settings (``jupyter_server_config.py`` or ``--TgnbServer.<name>=``): ``cluster`` (name or id to
attach to), ``local`` (attach to the local emulator even with a key), ``poll_interval`` (seconds
between reads of the cluster while the sidebar listens).
"""

from __future__ import annotations

from typing import Any


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    from tgnb.server.app import TgnbServer

    return [{"module": "tgnb.server", "app": TgnbServer}]
