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


#: The Post-Training API's Python fixes, as the ``%tg pt`` lines that do them (applied in order).
_PT_REWRITES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), repl)
    for pattern, repl in (
        (r"res\.stop\(force=True\)", "%tg pt stop --force"),
        (r"sess\.stop\(\) or (%tg pt stop --session ID)", r"\1"),
        (r"sess\.stop\(\)", "%tg pt stop --session ID"),
        (r"sess\.save\('inference'\)", "%tg pt save SESSION"),
        (r"pt\.start\(\.\.\., generators=(\d+)\)", r"%tg pt start MODEL --generators \1"),
        (r"pt\.start\(\.\.\., lora=True\)", "%tg pt start MODEL (without --full-weight)"),
        (r"pt\.start\(\.\.\.\)", "%tg pt start MODEL"),
        (r"pt\.models\(\)", "%tg pt models"),
        (r"pt\.resources\(\)", "%tg pt resources"),
        (r"res\.sessions\(\)", "%tg pt sessions"),
        (r"res\.checkpoints\(\)", "%tg pt checkpoints"),
        (r"\(e\.g\. lora=\{'rank': 8\}\)", "(e.g. --rank 8)"),
        (r"try lora=\{'rank': 8\}", "try --rank 8"),
        (r"open its session without lora=", "open its session without --rank/--alpha"),
        (r"\brank=(\d+)", r"--rank \1"),
        (r"\balpha=(\d+)", r"--alpha \1"),
        (r"\bdropout=([0-9.]+)", r"--dropout \1"),
        (r"\binactive_timeout=900\b", "--inactive-timeout 15m"),
    )
)


def as_pt_magic(message: str) -> str:
    """`message` with the Post-Training API's Python fixes written as ``%tg pt`` lines."""
    for pattern, repl in _PT_REWRITES:
        message = pattern.sub(repl, message)
    return message
