"""The workdir of a script run: the user's folder, snapshotted at launch, the same on every start.

Rules (docs/own-code.md, "The workdir", says the same):

- The workdir is the folder given as ``workdir=``, by default the folder of the notebook (the
  kernel's working directory) or of the calling script.
- Everything under it is taken except what `DEFAULT_IGNORE` and an ignore file `IGNORE_FILE` in it
  name: one pattern a line, ``#`` comments, shell wildcards matched against the path relative to
  the workdir and against each file or folder name; a trailing ``/`` names folders only.
- Credential files (`CREDENTIALS`: ``.env``, ``.netrc``, ``.ssh/``, ``*.pem``, cloud credential
  files...) are left out too, and the launch says which (`Snapshot.left_out`); to ship one, negate
  it in the ignore file (``!.env``). A negation (``!pattern``) takes back what an earlier pattern
  left out: the last pattern that matches decides, as in ``.gitignore`` (a file inside a folder left
  out stays out: negate the folder). tgnb's own home (`tgnb.config.default_home`: the runs, the
  emulator's state and key) is never taken when it lies inside the workdir (`Snapshot.notice` says
  so). A file that holds a registered secret
  (`tgnb.config.Scrubber.in_bytes`: whole, or its random part) is refused by name.
- At most `MAX_BYTES` in all (`max_bytes` to change it), `MAX_FILES` files and `MAX_DEPTH` folders
  deep (a deeper tree is refused, not walked until Python's recursion limit); symbolic links and
  special files are refused by name (a snapshot holds plain files only).
- It is taken once, at launch (`take`): each file read once, without following a link, into a
  private staging folder that the launch checks then read (`tgnb.prelaunch.plan`), so what was
  checked is what ships; the engine writes that snapshot into the run directory's ``workdir/``
  (`tgnb.runs.node.WORKDIR`). A restart or a requeue uses it, so editing the folder mid-run changes
  nothing running. On the node it is the working directory and the first entry of ``sys.path``.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import io
import os
import shutil
import stat
import sys
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from tgnb.config import default_home
from tgnb.errors import ValidationError

IGNORE_FILE = ".tgnbignore"
DEFAULT_IGNORE = (
    ".git/",
    ".hg/",
    "__pycache__/",
    ".ipynb_checkpoints/",
    ".venv/",
    "venv/",
    "node_modules/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    "*.pyc",
    "tgnb-out/",
    "wandb/",
)
#: Files that hold credentials by their name: left out unless the ignore file negates them.
CREDENTIALS = (
    ".env", ".env.*", "*.env", ".envrc", ".netrc", "_netrc", ".git-credentials", ".pgpass",
    ".pypirc", ".npmrc", ".ssh/", ".aws/", ".azure/", ".gnupg/", ".kube/", ".docker/",
    ".config/gcloud/", "gcloud/", ".huggingface/", "*.pem", "*.key", "*.p12", "*.pfx", "*.jks",
    "*.keystore", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", "credentials",
    "credentials.json", "application_default_credentials.json", "service-account*.json",
    "*serviceaccount*.json", "kubeconfig", "*.kubeconfig",
)  # fmt: skip
MAX_BYTES = 50 * 2**20
MAX_FILES = 10_000
#: Folders deep a snapshot goes at most (past it: a loop of bind mounts, generated data).
MAX_DEPTH = 64


def provides(root: Path, module: str) -> bool:
    """Whether ``import module`` would find its top-level name in folder `root` as Python does
    with `root` first on ``sys.path``: a module, a package, a namespace package (a folder with no
    ``__init__.py``) or an extension module. A run that imports it must ship `root`."""
    from importlib.machinery import PathFinder

    top = module.partition(":")[0].split(".")[0]
    return bool(top.isidentifier() and PathFinder.find_spec(top, [str(root)]) is not None)


def default_workdir() -> Path:
    """The calling script's folder when ``__main__`` is a file, else the working directory (in
    a notebook: the notebook's folder)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if path and Path(path).suffix == ".py" and "ipykernel" not in path:
        return Path(path).resolve().parent
    return Path.cwd()


@dataclass(frozen=True)
class Snapshot:
    """The files of a workdir (relative paths) and their total size, under `root`: the staged
    copy `take` made (its `source` the user's folder), or the folder itself (`scan`)."""

    root: Path
    files: tuple[str, ...]
    size: int
    source: Path | None = None

    @property
    def folder(self) -> Path:
        """The user's folder the snapshot was taken of."""
        return self.source or self.root

    def discard(self) -> None:
        """Remove the staged copy (nothing when the snapshot is the folder itself)."""
        if self.source is not None:
            shutil.rmtree(self.root, ignore_errors=True)

    #: credential files and folders left out by `CREDENTIALS` (the launch says so)
    left_out: tuple[str, ...] = ()
    #: tgnb's own home (runs, emulator, its key) when it lies inside the workdir: never shipped
    home_left_out: str | None = None

    def notice(self) -> str:
        """What the launch says of the credential files and tgnb's home left out ("" when
        none)."""
        lines = []
        if self.home_left_out:
            lines.append(
                f"tgnb: left tgnb's home {self.home_left_out} (its runs, emulator and keys) out "
                "of the workdir snapshot"
            )
        if self.left_out:
            names = ", ".join(self.left_out[:5]) + (", ..." if len(self.left_out) > 5 else "")
            first = self.left_out[0]
            lines.append(
                f"tgnb: left credential files out of the workdir snapshot: {names} (to ship one, "
                f"add !{first} to {self.folder / IGNORE_FILE})"
            )
        return "\n".join(lines)

    def with_files(self, files: Mapping[str, bytes]) -> Snapshot:
        """This staged snapshot with `files` (a plain name each: bytes) written into it beside
        the workdir's (`Session.submit` ships its pickled call so); a name the workdir has, a
        file holding a secret, or going over `MAX_BYTES` is refused."""
        assert self.source is not None, "only a staged snapshot (take) is written into"
        size = self.size
        for rel, data in files.items():
            if "/" in rel or rel in self.files or rel.startswith("."):
                raise ValidationError(f"{rel!r} cannot be added to the snapshot: name it otherwise")
            _secret_in(data, rel)
            size += len(data)
            if size > MAX_BYTES:
                raise ValidationError(
                    f"the workdir with {rel!r} ({len(data) / 2**20:.1f} MiB) is over "
                    f"{MAX_BYTES / 2**20:.0f} MiB: send less (read large data on the node)"
                )
            (self.root / rel).write_bytes(data)
            os.chmod(self.root / rel, 0o600)
        return replace(self, files=(*self.files, *files), size=size)

    def tar(self) -> bytes:
        """The snapshot as a gzipped tar (plain files, mode kept, owner and times reset)."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
            for rel in self.files:
                info = tar.gettarinfo(str(self.root / rel), arcname=rel)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                with open(self.root / rel, "rb") as fh:
                    tar.addfile(info, fh)
        return buf.getvalue()

    def copy_into(self, dest: Path) -> None:
        """Write the files under `dest` (created), as the node will see them."""
        for rel in self.files:
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            data = (self.root / rel).read_bytes()
            target.write_bytes(data)
            os.chmod(target, stat.S_IMODE((self.root / rel).stat().st_mode) | 0o400)


def _patterns(root: Path) -> list[str]:
    out = [*DEFAULT_IGNORE, *CREDENTIALS]
    ignore = root / IGNORE_FILE
    if ignore.is_file():
        for line in ignore.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def _ignored(rel: str, is_dir: bool, patterns: list[str]) -> str | None:
    """The pattern that leaves `rel` out (the last one matching, ``!`` taking back), or None."""
    name = rel.rsplit("/", 1)[-1]
    decided: str | None = None
    for pat in patterns:
        negated = pat.startswith("!")
        bare = pat[1:] if negated else pat
        dir_only = bare.endswith("/")
        bare = bare.rstrip("/").lstrip("/")
        if dir_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(rel, bare) or fnmatch.fnmatchcase(name, bare):
            decided = None if negated else pat
    return decided


def _secret_in(data: bytes, rel: str) -> None:
    """Refuse the file `rel` when it holds a registered secret (`tgnb.config.Scrubber.in_bytes`)."""
    from tgnb.config import holds_secret_bytes, register_env_secrets

    register_env_secrets()
    if holds_secret_bytes(data):
        raise ValidationError(
            f"workdir file {rel!r} holds a secret (an API key or token tgnb knows): remove it "
            f"from the file, or list the file in {IGNORE_FILE}, and pass the secret with secrets="
        )


def scan(
    root: str | os.PathLike[str],
    max_bytes: int = MAX_BYTES,
    max_files: int = MAX_FILES,
    *,
    read: bool = True,
) -> Snapshot:
    """The files a snapshot of `root` takes; `ValidationError` (naming the fix) when it is not a
    folder, holds a link or a special file, a file holding a secret (`read`: `take` checks the
    bytes it copies instead, so each file is read once), or is over the caps."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise ValidationError(f"workdir {str(base)!r} is not a folder: pass workdir= a folder")
    base = base.resolve()
    home = default_home().resolve()
    home_left_out: str | None = None
    patterns = _patterns(base)
    files: list[str] = []
    left_out: list[str] = []
    size = 0
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath)
        rel_dir = here.relative_to(base).as_posix()
        prefix = "" if rel_dir == "." else f"{rel_dir}/"
        keep = []
        for d in sorted(dirnames):
            if here / d == home:  # the runs' own folders, the emulator's state and key
                home_left_out = prefix + d + "/"
                continue
            why = _ignored(prefix + d, True, patterns)
            if why in CREDENTIALS:
                left_out.append(prefix + d + "/")
            if why is None:
                if (here / d).is_symlink():
                    raise ValidationError(
                        f"workdir holds a link {prefix + d!r}: a snapshot takes plain files; "
                        f"remove it or list it in {IGNORE_FILE}"
                    )
                keep.append(d)
        dirnames[:] = keep
        if keep and prefix.count("/") >= MAX_DEPTH:
            raise ValidationError(
                f"workdir {str(base)!r} holds folders more than {MAX_DEPTH} deep (under "
                f"{prefix.split('/')[0]!r:.60}): list that folder in {base / IGNORE_FILE}, or "
                "pass a smaller workdir="
            )
        for name in sorted(filenames):
            rel = prefix + name
            why = _ignored(rel, False, patterns)
            if why in CREDENTIALS:
                left_out.append(rel)
            if why is not None:
                continue
            st = os.lstat(here / name)
            if not stat.S_ISREG(st.st_mode):
                raise ValidationError(
                    f"workdir holds {rel!r}, which is not a plain file (a link or a special "
                    f"file): remove it or list it in {IGNORE_FILE}"
                )
            files.append(rel)
            size += st.st_size
            if read and size <= max_bytes:
                _secret_in((here / name).read_bytes(), rel)
            if len(files) > max_files or size > max_bytes:
                raise ValidationError(
                    f"workdir {str(base)!r} holds more than {max_files} files or "
                    f"{max_bytes / 2**20:.0f} MiB: list data, outputs and environments in "
                    f"{base / IGNORE_FILE} (one pattern a line), or pass a smaller workdir="
                )
    return Snapshot(base, tuple(files), size, left_out=tuple(left_out), home_left_out=home_left_out)


def _read_plain(path: Path, rel: str) -> tuple[bytes, int]:
    """The bytes and mode of the plain file at `path`, opened without following a link."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ValidationError(
            f"workdir file {rel!r} disappeared while the snapshot was taken: launch again once "
            "the folder stops changing"
        ) from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise ValidationError(
            f"workdir holds a link {rel!r}: a snapshot takes plain files; remove it or list it "
            f"in {IGNORE_FILE}"
        ) from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValidationError(
                f"workdir holds {rel!r}, which is not a plain file (a link or a special file): "
                f"remove it or list it in {IGNORE_FILE}"
            )
        return fh.read(), stat.S_IMODE(st.st_mode)


def take(
    root: str | os.PathLike[str], max_bytes: int = MAX_BYTES, max_files: int = MAX_FILES
) -> Snapshot:
    """The snapshot of `root`, staged: `scan`'s files, each read once (no link followed, a file
    gone mid-copy a `ValidationError`) into a new private folder, which is the returned
    snapshot's `root` (`Snapshot.discard` removes it). Launch checks read the staged copy and
    the engines ship it, so nothing changed in between reaches the node."""
    listed = scan(root, max_bytes, max_files, read=False)
    staged = Path(tempfile.mkdtemp(prefix="tgnb-workdir-"))
    try:
        size = 0
        for rel in listed.files:
            data, mode = _read_plain(listed.root / rel, rel)
            _secret_in(data, rel)
            size += len(data)
            if size > max_bytes:
                raise ValidationError(
                    f"workdir {str(listed.root)!r} grew past {max_bytes / 2**20:.0f} MiB while the "
                    f"snapshot was taken: list data and outputs in {IGNORE_FILE}"
                )
            target = staged / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            os.chmod(target, mode | 0o400)
    except BaseException:
        with contextlib.suppress(OSError):
            shutil.rmtree(staged)
        raise
    return Snapshot(
        staged,
        listed.files,
        size,
        source=listed.root,
        left_out=listed.left_out,
        home_left_out=listed.home_left_out,
    )
