"""Errors of the Python API, reworded for the magics: a fix written as a Python call
(``session.scale(preemptible=16)``) becomes the ``%tg`` line that does it
(``%tg scale --preemptible 16``), so a message in a notebook names what to type there."""

from __future__ import annotations

import re

#: (pattern of the Python phrasing, the magic phrasing), applied in order.
_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), repl)
    for pattern, repl in (
        (r"session\.scale\(preemptible=(\d+)\)", r"%tg scale --preemptible \1"),
        (r"\bpreemptible=False\b", "--standard"),
        (r"\bgpus_per_node<=(\d+)", r"--gpus-per-node \1 or less"),
        (r"\bgpus_per_node=(\d+)", r"--gpus-per-node \1"),
        (r"\bnodes<=(\d+)", r"--nodes \1 or less"),
        (r"another name= \(or session\.run\(name\)\)", "another --name (%tg runs lists them)"),
        (r"session\.run\(name\)", "%tg watch NAME"),
        (r"session\.runs\(\)", "%tg runs"),
        (r"tgnb\.attach\('NAME'\)", "%tg attach NAME"),
    )
)


def as_magic(message: str) -> str:
    """`message` with its Python-call fixes written as ``%tg`` lines."""
    for pattern, repl in _REWRITES:
        message = pattern.sub(repl, message)
    return message
