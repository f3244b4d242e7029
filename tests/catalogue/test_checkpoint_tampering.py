"""The fault catalogue's table for checkpoint tampering, through a real restart of a real run.

One real run (``python -m tgnb.train``, DPO on the built-in tiny model, a synchronous checkpoint at
each of its 3 steps) is copied once per case; each copy's checkpoints are tampered with as the case
says, and the copy is restarted for real -- ``python -m tgnb.train`` forked from one process that
imported the training stack once, as the local backend's warm starts do (`tamper_driver.py`), with
``max_steps=4`` so that every restart trains, saves and applies retention (``keep_last=1``).

The rule every case checks: a restart never hangs and never crashes on a checkpoint; one that cannot
be used (not a regular file inside its directory, named twice, too many, a link out of the run
directory, unloadable) is moved into ``quarantine/`` with its reason, reported (``CheckpointRejected``)
and the previous complete one is resumed from; nothing outside the run directory is read as part of
a checkpoint or changed by retention. Nothing here is faked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tgnb.train import checkpoint as ck

from .conftest import record

HERE = Path(__file__).parent
BASE = ("algorithm=dpo", "model=tiny", "checkpoint.every_steps=1", "checkpoint.async_save=false")
#: How long one restart may take before it counts as hung (a clean one takes a few seconds).
HANG_S = 90.0


def _marker(ckpt: Path) -> dict[str, Any]:
    return json.loads((ckpt / ck.MARKER).read_text())


def _write_marker(ckpt: Path, record_: dict[str, Any]) -> None:
    (ckpt / ck.MARKER).write_text(json.dumps(record_))


def _entry(ckpt: Path, rel: str, size: int | None = None) -> dict[str, Any]:
    """A manifest entry for `rel` with its true size and checksum where it can be read."""
    target = ckpt / rel if rel else ckpt
    if size is not None:
        return {"path": rel, "size": size, ck.ALGORITHM: ck.hasher().hexdigest()}
    got = ck._hash(target)
    return {"path": rel, "size": got[0], ck.ALGORITHM: got[1]}


def _add_entries(ckpt: Path, *entries: dict[str, Any]) -> None:
    rec = _marker(ckpt)
    rec["files"] = [*rec["files"], *entries]
    _write_marker(ckpt, rec)


def _reseal(ckpt: Path, rel: str) -> None:
    """Give `rel`'s manifest entry the file's current size and checksum (it "verifies")."""
    rec = _marker(ckpt)
    rec["files"] = [e if e["path"] != rel else _entry(ckpt, rel) for e in rec["files"]]
    _write_marker(ckpt, rec)


# -- the tamperings: each gets (checkpoints dir, a directory outside the run) --------------------
def entry_dev_zero(c: Path, out: Path) -> None:
    _add_entries(c / "checkpoint-3", {"path": "/dev/zero", "size": 0, ck.ALGORITHM: "0" * 32})


def entry_link_to_dev_zero(c: Path, out: Path) -> None:
    os.symlink("/dev/zero", c / "checkpoint-3" / "zero")
    _add_entries(c / "checkpoint-3", {"path": "zero", "size": 0, ck.ALGORITHM: "0" * 32})


def entry_fifo(c: Path, out: Path) -> None:
    os.mkfifo(c / "checkpoint-3" / "fifo")
    _add_entries(c / "checkpoint-3", {"path": "fifo", "size": 0, ck.ALGORITHM: "0" * 32})


def entry_directory(c: Path, out: Path) -> None:
    size = os.stat(c / "checkpoint-3" / "dcp").st_size
    _add_entries(c / "checkpoint-3", {"path": "dcp", "size": size, ck.ALGORITHM: "0" * 32})


def entry_empty_name(c: Path, out: Path) -> None:
    size = os.stat(c / "checkpoint-3").st_size
    _add_entries(c / "checkpoint-3", {"path": "", "size": size, ck.ALGORITHM: "0" * 32})


def quarantine_is_a_file(c: Path, out: Path) -> None:
    (c / ck.QUARANTINE).write_text("not a directory\n")
    (c / "checkpoint-3" / ck.MARKER).unlink()  # torn: it must be quarantined


def garbage_metadata(c: Path, out: Path) -> None:
    (c / "checkpoint-3" / "dcp" / ".metadata").write_bytes(b"\x80\x04garbage, not a pickle")
    _reseal(c / "checkpoint-3", "dcp/.metadata")


def garbage_optimizer_json(c: Path, out: Path) -> None:
    (c / "checkpoint-3" / "optimizer.json").write_text("[1, 2, 3]")
    _reseal(c / "checkpoint-3", "optimizer.json")


def shard_linked_elsewhere(c: Path, out: Path) -> None:
    shard = c / "checkpoint-3" / "dcp" / "__0_0.distcp"
    shutil.copy2(shard, out / "__0_0.distcp")
    shard.unlink()
    os.symlink(out / "__0_0.distcp", shard)


def marker_linked_to_dev_zero(c: Path, out: Path) -> None:
    (c / "checkpoint-3" / ck.MARKER).unlink()
    os.symlink("/dev/zero", c / "checkpoint-3" / ck.MARKER)


def checkpoint_dir_is_a_link(c: Path, out: Path) -> None:
    shutil.copytree(c / "checkpoint-3", out / "ck8")
    rec = _marker(out / "ck8")
    _write_marker(out / "ck8", {**rec, "step": 8})
    os.symlink(out / "ck8", c / "checkpoint-8")


def retention_meets_a_link(c: Path, out: Path) -> None:
    shutil.copytree(c / "checkpoint-1", out / "ck1")
    shutil.rmtree(c / "checkpoint-1")
    os.symlink(out / "ck1", c / "checkpoint-1")


def entry_dotdot(c: Path, out: Path) -> None:
    _add_entries(c / "checkpoint-3", _entry(c / "checkpoint-3", "../checkpoint-2/optimizer.json"))


def entry_listed_twice(c: Path, out: Path) -> None:
    _add_entries(c / "checkpoint-3", _entry(c / "checkpoint-3", "optimizer.json"))


def entries_150k(c: Path, out: Path) -> None:
    one = _entry(c / "checkpoint-3", "optimizer.json")
    _add_entries(c / "checkpoint-3", *([one] * 150_000))


@dataclass(frozen=True)
class Case:
    id: str
    tamper: Callable[[Path, Path], None]
    resumed: int  # the step the restart must resume from
    rejected: str | None  # the checkpoint moved into quarantine/, if any
    reason: str  # a piece of its reason
    outside_kept: tuple[str, ...] = ()  # files outside the run dir that must be left as they were


CASES = [
    Case("entry-/dev/zero", entry_dev_zero, 2, "checkpoint-3", "not a plain path"),
    Case("entry-link-to-/dev/zero", entry_link_to_dev_zero, 2, "checkpoint-3", "symbolic link"),
    Case("entry-fifo", entry_fifo, 2, "checkpoint-3", "FIFO"),
    Case("entry-a-directory", entry_directory, 2, "checkpoint-3", "dcp: a directory"),
    Case("entry-empty-name", entry_empty_name, 2, "checkpoint-3", "empty name"),
    Case("quarantine-is-a-file", quarantine_is_a_file, 2, "checkpoint-3", "missing"),
    Case("garbage-.metadata-resealed", garbage_metadata, 2, "checkpoint-3", "cannot be loaded"),
    Case("garbage-optimizer.json", garbage_optimizer_json, 2, "checkpoint-3", "cannot be loaded"),
    Case(
        "shard-linked-to-a-copy-outside",
        shard_linked_elsewhere,
        2,
        "checkpoint-3",
        "symbolic link",
        ("__0_0.distcp",),
    ),
    Case("marker-linked-to-/dev/zero", marker_linked_to_dev_zero, 2, "checkpoint-3", "link"),
    Case(
        "checkpoint-8-a-link-outside",
        checkpoint_dir_is_a_link,
        3,
        "checkpoint-8",
        "not a directory",
        ("ck8/tgnb-complete.json", "ck8/optimizer.json"),
    ),
    Case(
        "retention-meets-a-link",
        retention_meets_a_link,
        3,
        None,
        "",
        ("ck1/tgnb-complete.json", "ck1/dcp/__0_0.distcp"),
    ),
    Case("entry-../", entry_dotdot, 2, "checkpoint-3", "not a plain path"),
    Case("entry-listed-twice", entry_listed_twice, 2, "checkpoint-3", "listed twice"),
    Case("150k-entries", entries_150k, 2, "checkpoint-3", f"more than {ck.MAX_FILES}"),
]


def _env(tmp: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "TGNB_HOME": str(tmp / "home"),
    }
    for name in ("TGNB_NOTICE_FILE", "SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_RESTART_COUNT"):
        env.pop(name, None)
    return env


@pytest.fixture(scope="module")
def restarts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case restarted once: ``{id: {"code", "dir", "outside", "before"}}``."""
    tmp = tmp_path_factory.mktemp("tamper")
    env = _env(tmp)
    base = tmp / "base"
    sets = [x for o in (*BASE, "max_steps=3", "checkpoint.keep_last=3") for x in ("--set", o)]
    got = subprocess.run(
        [sys.executable, "-m", "tgnb.train", "--run-dir", str(base), *sets],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert got.returncode == 0, got.stdout[-3000:] + got.stderr[-3000:]
    assert [p.name for p in ck.checkpoint_dirs(base / "checkpoints")] == [
        "checkpoint-3",
        "checkpoint-2",
        "checkpoint-1",
    ]
    out: dict[str, dict[str, Any]] = {}
    for i, case in enumerate(CASES):
        run_dir, outside = tmp / f"case-{i}", tmp / f"outside-{i}"
        shutil.copytree(base, run_dir)
        outside.mkdir()
        case.tamper(run_dir / "checkpoints", outside)
        before = {rel: (outside / rel).read_bytes() for rel in case.outside_kept}
        out[case.id] = {"dir": run_dir, "outside": outside, "before": before}
    sets = [x for o in (*BASE, "max_steps=4", "checkpoint.keep_last=1") for x in ("--set", o)]
    dirs = [str(out[c.id]["dir"]) for c in CASES]
    driver = [sys.executable, str(HERE / "tamper_driver.py"), str(HANG_S), *dirs, "--", *sets]
    got = subprocess.run(driver, capture_output=True, text=True, env=env, timeout=3000)
    assert got.returncode == 0, got.stderr[-3000:]
    codes = {json.loads(line)["dir"]: json.loads(line)["code"] for line in got.stdout.splitlines()}
    for c in CASES:
        out[c.id]["code"] = codes[str(out[c.id]["dir"])]
    return out


def _events(run_dir: Path, reason: str) -> list[dict[str, Any]]:
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["reason"] == reason]


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_tampered_checkpoint_is_quarantined_and_the_previous_one_resumed(
    case: Case, restarts: dict[str, dict[str, Any]]
) -> None:
    got = restarts[case.id]
    run_dir: Path = got["dir"]
    log = Path(f"{run_dir}.log").read_text()[-3000:]
    clean = got["code"] == 0
    record(refused=clean)
    assert got["code"] is not None, f"the restart hung for {HANG_S} s:\n{log}"
    assert got["code"] == 0, f"the restart exited {got['code']}:\n{log}"
    resumed = [e["data"]["step"] for e in _events(run_dir, "RunResumed")]
    assert resumed == [case.resumed], log
    rejected = _events(run_dir, "CheckpointRejected")
    quarantined = sorted((run_dir / "checkpoints" / ck.QUARANTINE).glob("*/REASON.txt"))
    if case.rejected is None:
        assert not rejected and not quarantined
    else:
        assert [Path(e["data"]["checkpoint"]).name for e in rejected] == [case.rejected]
        assert case.reason in rejected[0]["data"]["cause"], rejected[0]
        assert len(quarantined) == 1 and quarantined[0].parent.name.startswith(case.rejected)
        assert case.reason in quarantined[0].read_text()
    latest = ck.latest_complete(run_dir / "checkpoints")
    assert latest is not None and latest.step == 4
    for rel, data in got["before"].items():  # nothing outside the run directory changed
        assert (got["outside"] / rel).read_bytes() == data, rel
