"""The workload plane's notebook-facing modules stay light: no torch, TRL, transformers or
kubernetes at import time (the training stack is imported by the processes that train)."""

from tests.conftest import heavy_in, modules_after


def test_session_and_local_backend_import_light() -> None:
    loaded = modules_after(
        "import tgnb, tgnb.session, tgnb.runs, tgnb.demo, tgnb.backends.local,"
        " tgnb.backends.registry, tgnb.backends.local.supervisor, tgnb.backends.local.warm\n"
        "assert tgnb.attach is tgnb.session.attach and tgnb.Session is tgnb.session.Session"
    )
    assert heavy_in(loaded) == []
