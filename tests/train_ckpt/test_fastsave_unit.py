"""The guard's own checkpoint writer (`tgnb.train.fastsave`, `tgnb.train.hashedio`) and sealing with
entries it already checksummed: files that the libraries' own readers load, checksums equal to
the manifest's, ``O_DIRECT`` and its fallback where a file system refuses it."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from tgnb.train import checkpoint as ck
from tgnb.train import fastsave, hashedio

ALGO = "xxh3_128"


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "f32": torch.randn(3, 5, generator=g),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "i64": torch.arange(11),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "strided": torch.randn(6, 4, generator=g).t(),  # not contiguous
        "flag": torch.tensor([True, False]),
    }


@pytest.mark.parametrize("direct", [False, True])
def test_safetensors_written_from_memory_load_back_and_match_their_checksum(
    tmp_path: Path, direct: bool
) -> None:
    src = tensors()
    path = tmp_path / "model.safetensors"
    out = fastsave.write_safetensors(path, src, ALGO, direct=direct)
    out.close()
    assert out.direct == direct  # ext4 takes O_DIRECT here
    got = load_file(str(path))
    assert got.keys() == src.keys()
    for name, t in src.items():
        assert got[name].dtype == t.dtype and torch.equal(got[name], t)
    entry = out.entry(tmp_path)
    assert entry.size == path.stat().st_size
    assert (entry.size, entry.digest) == ck._hash(path, ALGO)


def test_direct_io_pads_the_last_block_then_cuts_the_file_to_size(tmp_path: Path) -> None:
    data = bytes(range(256)) * 40_000  # 10,240,000 bytes: more than one staging buffer, unaligned
    out = hashedio.HashingFile(tmp_path / "x.bin", ALGO, direct=True)
    for i in range(0, len(data), 1_000_003):
        out.write(data[i : i + 1_000_003])
    out.finish()
    out.close()
    assert (tmp_path / "x.bin").read_bytes() == data
    assert out.entry(tmp_path).digest == ck._hash(tmp_path / "x.bin", ALGO)[1]


def test_a_file_system_refusing_o_direct_is_written_through_the_page_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stand-in: an ``os.open`` that answers EINVAL to O_DIRECT, as some network and FUSE file
    systems do (this machine's ext4 and tmpfs both accept it)."""
    real = os.open

    def refusing(path: Any, flags: int, mode: int = 0o777) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(path, flags, mode)

    monkeypatch.setattr(os, "open", refusing)
    out = hashedio.HashingFile(tmp_path / "x.bin", ALGO, direct=True)
    out.write(b"abc" * 1000)
    out.finish()
    out.close()
    assert not out.direct
    assert (tmp_path / "x.bin").read_bytes() == b"abc" * 1000


def test_torch_save_through_a_hashing_file_loads_back(tmp_path: Path) -> None:
    obj = {"state": {0: {"exp_avg": torch.randn(100), "step": torch.tensor(3.0)}}, "lr": 0.1}
    out = fastsave._torch_save(obj, tmp_path / "optimizer.pt", ALGO, direct=True)
    out.close()
    got = torch.load(tmp_path / "optimizer.pt", weights_only=True)
    assert torch.equal(got["state"][0]["exp_avg"], obj["state"][0]["exp_avg"])  # type: ignore[index]
    assert out.entry(tmp_path).digest == ck._hash(tmp_path / "optimizer.pt", ALGO)[1]


def test_tied_weights_are_written_once() -> None:
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(10, 4)
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.head.weight = model.embed.weight
    assert list(fastsave.model_tensors(model)) == ["embed.weight"]


def test_known_entries_are_sealed_without_reading_the_files_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "checkpoint-4"
    root.mkdir()
    (root / "a.bin").write_bytes(b"a" * 100)
    (root / "b.bin").write_bytes(b"b" * 50)
    known = [ck.FileEntry("a.bin", 100, "given-digest", ALGO)]
    hashed: list[str] = []
    real = ck._hash
    monkeypatch.setattr(ck, "_hash", lambda p, a="sha256": hashed.append(p.name) or real(p, a))
    ckpt = ck.write_marker(root, 4, algorithm=ALGO, known=known)
    assert hashed == ["b.bin"]
    digests = {e.path: e.digest for e in ckpt.files}
    assert digests["a.bin"] == "given-digest"
    # a known entry whose size no longer matches the file is not trusted
    hashed.clear()
    (root / "tgnb-complete.json").unlink()
    stale = [ck.FileEntry("a.bin", 99, "stale", ALGO)]
    ckpt = ck.write_marker(root, 4, algorithm=ALGO, known=stale)
    assert sorted(hashed) == ["a.bin", "b.bin"]
    assert ck.verify(root) is not None
