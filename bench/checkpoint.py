"""Checkpoint cost on preemption, as a ratio to a plain write of the same bytes, measured side by side.

For each model (the built-in ``tiny`` and a ~100M-parameter Llama with random weights and the tiny
character tokenizer, built locally; nothing is downloaded) this starts a real
``python -m tgnb.train`` DPO run, sends it SIGTERM mid-run, and measures

- ``sigterm_to_complete``: wall time from the signal to the completion marker's time. A single
  process checkpoints the last step boundary at once (`tgnb.train.immediate`), so this is the
  signal's delivery (``wait``) plus the ``save``; with several processes it also holds the wait for
  the step in progress to end (they agree on a step boundary first). A state under 16 MB (the tiny
  model's) is written as one file into a spare allocated beside training (`tgnb.train.express`;
  its size, padding included, is the ``bytes`` compared); a larger one in the Trainer's layout, its
  big files through ``O_DIRECT``;
- ``save``: from the start of the save to the sealed marker, split into ``write`` (the files, each
  fsynced) and ``seal`` (tgnb's marker: checksums already taken while writing, directory fsyncs);
- ``plain``: a sequential write + fsync (file and directory) of the same number of bytes in the same
  directory, right after, median of 3.

On a virtual machine whose host reclaims the guest's free memory (these ones do), writing into
page cache that must be faulted in again costs up to ten times more than writing into pages freed a
moment before. The ``plain`` write, measured right after the run's process exits, gets such freshly
freed pages -- the favourable case for the baseline. tgnb's large checkpoint files bypass the page
cache (``O_DIRECT``, `tgnb.train.hashedio`), so its figure does not depend on that state.

It prints ``sigterm_to_complete / plain`` and ``save / plain``. Target: <= 1.5.

Each model is preempted `--repeats` times (each restart resumes the run); the lower median is printed.
With ``--baseline SRC`` (a directory holding another version of the ``tgnb`` package, e.g. from
``git archive <commit> tgnb | tar -x -C SRC``) the same is measured for that version too, its runs
interleaved with this version's so both see the same machine load; rows are labelled ``baseline``
and ``current``.

Usage: ``python bench/checkpoint.py [--models tiny,100m] [--repeats 2] [--keep DIR] [--baseline SRC]``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CHUNK = 8 << 20


def build_100m(path: Path) -> int:
    """A Llama of about 100M parameters with random weights and the tiny tokenizer, saved to `path`."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tgnb.train import assets

    ids = assets.vocab()
    config = LlamaConfig(
        vocab_size=len(ids),
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=14,
        num_attention_heads=12,
        num_key_value_heads=12,
        max_position_embeddings=256,
        pad_token_id=ids[assets.PAD],
        bos_token_id=ids[assets.BOS],
        eos_token_id=ids[assets.EOS],
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.save_pretrained(path)
    assets.build_tokenizer().save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


def plain_write(directory: Path, nbytes: int) -> float:
    """Seconds to write `nbytes` sequentially, fsync the file and the directory, in `directory`."""
    buf = os.urandom(CHUNK)
    path = directory / "plain-write.bin"
    began = time.perf_counter()
    with open(path, "wb", buffering=0) as fh:
        left = nbytes
        while left > 0:
            n = fh.write(buf[: min(CHUNK, left)])
            left -= n or 0
        os.fsync(fh.fileno())
    fd = os.open(directory, os.O_RDONLY)
    os.fsync(fd)
    os.close(fd)
    took = time.perf_counter() - began
    path.unlink()
    return took


def events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def steps_logged(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if line.strip())


def measure(
    name: str, model: str, work: Path, env: dict[str, str], batch: int, label: str = "current"
) -> dict[str, Any]:
    run_dir = work / f"run-{name}-{label}"
    cmd = [
        sys.executable,
        "-m",
        "tgnb.train",
        "--run-dir",
        str(run_dir),
        "--set",
        "algorithm=dpo",
        "--set",
        f"model={model}",
        "--set",
        "max_steps=100000",
        "--set",
        f"trl.per_device_train_batch_size={batch}",
        "--set",
        "trl.gradient_checkpointing=false",
        "--set",
        "checkpoint.watch_drain=false",
    ]
    log = open(work / f"{name}-{label}.log", "a")  # noqa: SIM115 - closed below
    # cwd: the work directory, so that PYTHONPATH (a baseline's tgnb), not this checkout, comes first
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    before = steps_logged(run_dir)
    try:
        deadline = time.monotonic() + 900
        while steps_logged(run_dir) < before + 2:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"{name}: training did not reach step 3; see {log.name}")
            time.sleep(0.05)
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    saved = [e["data"] for e in events(run_dir) if e["reason"] == "CheckpointSaved"][-1]
    marker = json.loads((Path(saved["checkpoint"]) / "tgnb-complete.json").read_text())
    total = saved["sealed_at"] - sent  # the marker is durable (renamed, directory fsynced)
    save = saved["sealed_at"] - saved.get("started_at", saved["sealed_at"] - saved["duration_s"])
    plain = statistics.median([plain_write(run_dir, marker["bytes"]) for _ in range(3)])
    return {
        "model": name,
        "version": label,
        "exit_code": code,
        "bytes": marker["bytes"],
        "sigterm_to_complete_s": round(total, 5),
        "wait_s": round(total - save, 5),  # SIGTERM -> the save starts
        "save_s": round(save, 5),
        "write_s": round(save - saved["seal_s"], 5),
        "seal_s": saved["seal_s"],
        "trigger": saved["trigger"],
        "plain_write_fsync_s": round(plain, 5),
        "ratio_sigterm_to_complete": round(total / plain, 3),
        "ratio_save": round(save / plain, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="tiny,100m")
    p.add_argument("--repeats", type=int, default=2, help="preemptions per model (median kept)")
    p.add_argument("--keep", help="work directory to keep (default: a temporary one)")
    p.add_argument("--baseline", help="a directory holding another tgnb package to compare with")
    args = p.parse_args(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="tgnb-bench-ckpt-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "TGNB_HOME": str(work / "home"),
    }
    env.pop("TGNB_NOTICE_FILE", None)
    versions = {"current": {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}}
    if args.baseline:
        versions = {
            "baseline": {**env, "PYTHONPATH": str(Path(args.baseline).resolve())},
            **versions,
        }
    rows = []
    for name in args.models.split(","):
        if name == "tiny":
            model, batch = "tiny", 8
        elif name == "100m":
            path = work / "model-100m"
            if not (path / "config.json").exists():
                params = build_100m(path)
                print(f"built a {params / 1e6:.1f}M-parameter model in {path}", flush=True)
            model, batch = str(path), 1
        else:
            raise SystemExit(f"unknown model {name!r}; use tiny and/or 100m")
        # Each repeat resumes the same run and preempts it again; the median row is kept.
        by_label: dict[str, list[dict[str, Any]]] = {label: [] for label in versions}
        for _ in range(max(1, args.repeats)):
            for label, version_env in versions.items():
                sample = measure(name, model, work, version_env, batch, label)
                print(json.dumps(sample), flush=True)
                by_label[label].append(sample)
        for samples in by_label.values():
            samples.sort(key=lambda r: r["ratio_sigterm_to_complete"])
            rows.append(samples[(len(samples) - 1) // 2])
    for row in rows:
        ms = {k: row[k] * 1e3 for k in ("sigterm_to_complete_s", "save_s", "plain_write_fsync_s")}
        ms.update({k: row[k] * 1e3 for k in ("wait_s", "write_s", "seal_s")})
        print(
            f"{row['model']:>5} {row['version']:>8}: {row['bytes'] / 1e6:9.1f} MB  SIGTERM->complete "
            f"{ms['sigterm_to_complete_s']:.1f} ms  save {ms['save_s']:.1f} ms  plain write+fsync "
            f"{ms['plain_write_fsync_s']:.1f} ms  ratio {row['ratio_sigterm_to_complete']:.2f} "
            f"(save only {row['ratio_save']:.2f}; target <= 1.5)  [wait {ms['wait_s']:.1f} ms, "
            f"write {ms['write_s']:.1f} ms, seal {ms['seal_s']:.1f} ms; {row['trigger']}]"
        )
    if not args.keep:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
