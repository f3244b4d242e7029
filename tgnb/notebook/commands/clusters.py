"""``%tg clusters``: the project's clusters, from the attached session's cloud or the environment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tgnb.notebook.commands.grammar import Parser
from tgnb.notebook.tables import Table

if TYPE_CHECKING:
    from tgnb.cloud import Cloud
    from tgnb.notebook.magics import Tg


def arguments(p: Parser) -> None:
    pass


def run(tg: Tg, args: Any, cell: str | None) -> Table:
    cloud: Cloud
    if tg.session is not None:
        cloud = tg.session.cloud
    else:
        from tgnb.cloud import Cloud

        cloud = Cloud.from_env()
    rows = [
        (
            c.name,
            c.id,
            c.type,
            c.status,
            c.gpu_type,
            str(c.num_gpus),
            f"{c.allocated_preemptible_gpus}/{c.desired_preemptible_gpus}",
        )
        for c in cloud.clusters()
    ]
    head = ("NAME", "ID", "TYPE", "STATUS", "GPU", "STANDARD", "PREEMPTIBLE ALLOC/TARGET")
    return Table(head, rows, "no clusters in this project")
