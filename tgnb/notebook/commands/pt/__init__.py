"""``%tg pt ...``: the Post-Training API from a notebook line, onto `tgnb.posttraining` (``%tg pt
--help`` lists the subcommands, ``%tg pt NAME --help`` each one). They are rows ``"pt NAME"`` of
the one table of `tgnb.notebook.commands`, routed by the same `Tg` magic.

They work on one connection (the local emulator unless ``%tg pt connect --remote``) and one
current model resource (set by ``start`` or ``attach``; ``--resource ID`` names another): the
`PtState` of the kernel. `tgnb.posttraining` is imported on the first call, not by ``%load_ext``.
"""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError


class PtState:
    """The state of ``%tg pt`` in one kernel: the connection and the current resource."""

    def __init__(self) -> None:
        self.pt: Any = None
        self.resource: Any = None

    def handle(self, local: bool | None = None, fresh: bool = False) -> Any:
        """The `PostTraining` handle, made on first use (or anew when `fresh`): `local` None is
        `tgnb.post_training`'s default, the one `%tg attach` has (the key decides)."""
        if self.pt is None or fresh:
            from tgnb.posttraining import post_training

            self.pt = post_training(local=local)
        return self.pt

    def current(self, resource_id: str | None) -> Any:
        """The resource `resource_id` names (attached: its id is checked there), else the current."""
        if resource_id:
            if self.resource is not None and self.resource.id == resource_id:
                return self.resource
            return self.handle().attach(resource_id)
        if self.resource is None:
            raise UsageError(
                "no current model resource: %tg pt start MODEL, or %tg pt attach RESOURCE_ID"
            )
        return self.resource


def when(t: Any, tz: str = "UTC") -> str:
    """A time as the tables show it, in the display time zone (``-`` for none)."""
    if t is None:
        return "-"
    from tgnb.notebook.timeline import zone

    return str(t.astimezone(zone(tz)).strftime("%Y-%m-%d %H:%M:%S"))


__all__ = ["PtState", "when"]
