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


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "tgnb.server"}]


def _load_jupyter_server_extension(serverapp: Any) -> None:
    """Register the handlers and one `Cockpit` on the server's web application."""
    from tgnb.server.handlers import handlers
    from tgnb.server.service import Cockpit

    conf = serverapp.config.get("TgnbServer", {})
    cockpit = Cockpit(
        cluster=conf.get("cluster") or None,
        local=bool(conf.get("local", False)),
        poll_interval=float(conf.get("poll_interval", 1.0)),
    )
    web_app = serverapp.web_app
    web_app.settings["tgnb_cockpit"] = cockpit
    web_app.add_handlers(".*$", handlers(web_app.settings["base_url"]))
    serverapp.log.info("tgnb server extension: /tgnb/ API registered")


# Older notebook-server style names, used by some tools.
load_jupyter_server_extension = _load_jupyter_server_extension
