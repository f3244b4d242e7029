"""`AdminClient` against a real emulator daemon over HTTP; and no admin URL is built elsewhere."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import httpx
import pytest

import tgnb
from tests.conftest import wait_until
from tgnb.emulator.admin import AdminClient
from tgnb.emulator.testing import EmulatorHandle

from .conftest import create


def test_admin_client_takes_the_sdk_base_url_and_checks_the_key(emulator: EmulatorHandle) -> None:
    with AdminClient(emulator.base_url + "/v1", emulator.api_key) as admin:
        assert admin.base_url == emulator.base_url
        assert admin.health()["pid"] == emulator.pid
        assert admin.set_chaos(0.25, seed=3)["fraction"] == 0.25
        assert admin.chaos()["fraction"] == 0.25
        assert admin.set_chaos(0.0)["fraction"] == 0.0
    with (
        AdminClient(emulator.base_url, "not-the-key") as wrong,
        pytest.raises(httpx.HTTPStatusError) as info,
    ):
        wrong.health()
    assert info.value.response.status_code == 401


def test_admin_client_preempts_and_releases_a_node(sdk: Any, emulator: EmulatorHandle) -> None:
    cid = create(sdk, cluster_name="admin-c", num_preemptible_gpus=8, project_id="p").cluster_id
    with AdminClient(emulator.base_url, emulator.api_key) as admin:
        wait_until(lambda: sdk.clusters.retrieve(cid).allocated_preemptible_gpus == 8)
        victim = admin.preempt(cid)
        assert victim["kind"] == "preemptible" and victim["state"] == "draining"
        released = admin.release(cid, victim["name"])
        assert released["name"] == victim["name"] and released["state"] == "removed"
        assert {n["name"]: n["state"] for n in admin.nodes(cid)}[victim["name"]] == "removed"
        with pytest.raises(httpx.HTTPStatusError) as info:
            admin.preempt(cid, "no-such-node")
    assert info.value.response.status_code == 404


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants in code (f-strings' literal parts included), docstrings left out."""
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_no_admin_url_is_built_outside_the_client() -> None:
    """Only the client and the modules that serve the routes spell ``/_emulator`` in code."""
    root = Path(tgnb.__file__).parent
    allowed = {
        root / "emulator" / "admin.py",
        root / "emulator" / "app.py",
        root / "emulator" / "rl" / "app.py",  # serves the Post-Training admin routes
    }
    found = [
        f"tgnb/{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path not in allowed
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8")))
        if "/_emulator" in text
    ]
    assert not found, "admin URLs built by hand (use tgnb.emulator.admin.AdminClient): " + (
        ", ".join(found)
    )
