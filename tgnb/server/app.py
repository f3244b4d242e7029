"""`TgnbServer`: the jupyter-server extension application (settings, routes, clean shutdown)."""

from __future__ import annotations

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Unicode

from tgnb.server.handlers import routes
from tgnb.server.service import Cockpit


class TgnbServer(ExtensionApp):
    """Serves the tgnb API under ``<base_url>/tgnb/`` on one `Session` per Jupyter server.

    Configure with ``--TgnbServer.cluster=NAME`` or in ``jupyter_server_config.py``.
    """

    name = "tgnb"
    load_other_extensions = True

    cluster = Unicode(
        None,
        allow_none=True,
        config=True,
        help="Cluster name or id to attach to (default: the only one, or the emulator's demo cluster).",
    )
    local = Bool(
        False, config=True, help="Attach to the local emulator even when TOGETHER_API_KEY is set."
    )
    poll_interval = Float(
        1.0,
        config=True,
        help="Seconds between reads of the cluster and the runs while the sidebar listens.",
    )

    def initialize_settings(self) -> None:
        self.cockpit = Cockpit(
            cluster=self.cluster or None, local=self.local, poll_interval=self.poll_interval
        )
        self.settings["tgnb_cockpit"] = self.cockpit

    def initialize_handlers(self) -> None:
        self.handlers.extend(routes())

    async def stop_extension(self) -> None:
        """Stop the poller and close the session's HTTP connections."""
        await self.cockpit.aclose()
