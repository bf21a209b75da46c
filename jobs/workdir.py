"""What `docintel submit --working-dir` ships, decided before anything is copied.

The job runs on a shared cluster, and Ray keeps the uploaded package in the GCS for every
holder of the cluster's token to read, so the rules are one-way:

- **Secrets never ship.** ``DENY`` (and ``NEVER``: VCS data, virtualenvs) is checked
  first, on the path lower-cased, and nothing overrides it: the folder's ``.gitignore`` /
  ``.rayignore`` can only leave more out (a ``!.env`` or ``!*.pem`` there changes
  nothing). A ``*.json`` file holding a ``"private_key"`` field (a GCP service-account
  key, whatever its name) is left out too, checked when planning and again while copying.
- **Symlinks never ship**, to files or folders, inside the folder or not. Checking a link's
  target against the rules would leave a window between the check and the upload in
  which the link can change, and a target inside the folder ships anyway under its own
  name; so the rule has no exception to get wrong. Files are copied by opening every
  component of their path with ``O_NOFOLLOW`` from the folder down, so a file or folder
  swapped for a link after planning fails the staging instead of shipping what the link
  names.
- Tests, benchmarks, outputs and caches (``EXCLUDES``) and what the ignore files list are
  left out too; unlike the deny list, the ignore files may re-include those.
- **The size is capped**: ``copy_plan`` stops at ``max_bytes`` (`docintel submit` checks
  the plan's total against ``[job] max_working_dir_mb`` before copying).

``plan_working_dir`` returns every path with its fate and the total size, which `docintel
submit --dry-run` prints and ``copy_plan`` carries out.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pathspec

from docintel.pipeline.errors import UsageError

# Never part of a --working-dir upload, whatever the ignore files say. .gitignore syntax,
# matched against the path lower-cased (so ID_RSA and Server.PEM are caught too); a name
# without "/" matches at any depth, a trailing "/" means a folder and all it holds.
DENY = (
    # environment files (dotenv, direnv)
    ".env",
    ".env.*",
    ".envrc",
    # private keys, certificates with keys, key stores
    "*.pem",
    "*.key",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    # credential files of common tools (AWS and others' "credentials", git, netrc, PyPI,
    # npm / yarn, PostgreSQL, kubeconfig, Ray's token file, Terraform state)
    "credentials",
    "credentials.json",
    # cloud and tool configs that hold keys or tokens: pyiceberg (where docintel's own
    # messages put Iceberg credentials), s3cmd, boto, Databricks, Vault, rclone, Streamlit,
    # Hugging Face, PuTTY keys, legacy Docker and Terraform CLI tokens
    ".pyiceberg.yaml",
    ".s3cfg",
    ".boto",
    ".databrickscfg",
    ".vault-token",
    "rclone.conf",
    "**/.streamlit/secrets.toml",
    "**/.huggingface/token",
    "**/huggingface/token",
    "*.ppk",
    ".dockercfg",
    ".terraformrc",
    "terraform.rc",
    ".git-credentials",
    ".netrc",
    "_netrc",
    ".pypirc",
    ".npmrc",
    ".yarnrc.yml",
    ".pgpass",
    ".htpasswd",
    "kubeconfig",
    "*.kubeconfig",
    "auth_token",
    "ray-auth-token",
    "*.tfstate",
    "*.tfstate.*",
    # credential folders (SSH, clouds, Kubernetes, Docker's config.json, GnuPG, Ray)
    ".ssh/",
    ".aws/",
    ".azure/",
    ".kube/",
    ".docker/",
    ".gnupg/",
    ".ray/",
    "**/.config/gcloud/",
)
# Never shipped either, and not overridable: VCS data (its config can hold tokens in
# remote URLs) and virtualenvs (large, with links out of the folder; the cluster has its
# own). Same syntax and matching as DENY.
NEVER = (".git/", ".hg/", ".svn/", ".venv/", "venv/")
# Left out by default; the ignore files may re-include these (they hold no secrets).
EXCLUDES = (
    "/tests/",
    "/bench/",
    "/demo-out/",
    "/out/",
    "/models/int8/",
    "__pycache__/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".mypy_cache/",
    "*.egg-info/",
    "/build/",
    "/dist/",
)
# Read from the --working-dir root, in .gitignore syntax, after EXCLUDES.
IGNORE_FILES = (".gitignore", ".rayignore")
SYMLINK_REASON = "symlink: never shipped; a target inside the folder ships under its own name"
# A *.json file holding this field is a private key (a GCP service-account key file).
PRIVATE_KEY = b'"private_key"'
PRIVATE_KEY_REASON = (
    'secret: a JSON file with a "private_key" field (a service-account key); never shipped, '
    "whatever the ignore files say"
)
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class LeftOut:
    """A path that does not ship (a folder ends with "/") and why."""

    path: str
    reason: str


@dataclass
class Plan:
    """Every file that ships (paths relative to ``root``, "/"-separated) and every path
    left out, in walk order (sorted, depth first). ``root`` None: no folder ships."""

    root: Path | None
    ship: list[str] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
    bytes: int = 0  # the files that ship, by their size when planned


@dataclass
class Copied:
    """What ``copy_plan`` copied, and the planned files it left out after all (a JSON
    file that turned out to hold a private key while being copied)."""

    files: int = 0
    bytes: int = 0
    left_out: list[LeftOut] = field(default_factory=list)


def _pattern_lines(path: Path) -> list[str]:
    """The patterns of an ignore file: blank lines and comments dropped."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


class _Rules:
    """Why a path is left out: the deny list first (final), then the defaults and the
    ignore files (gitignore semantics: the last matching pattern wins)."""

    def __init__(self, root: Path) -> None:
        self.deny = pathspec.GitIgnoreSpec.from_lines([*DENY, *NEVER])
        sources = [(p, "excluded by default") for p in EXCLUDES]
        for name in IGNORE_FILES:
            sources += [(p, f"listed in {name}") for p in _pattern_lines(root / name)]
        self.sources = sources
        self.ignore = pathspec.GitIgnoreSpec.from_lines([p for p, _ in sources])

    def denied(self, rel: str) -> str | None:
        hit = self.deny.check_file(rel.lower())
        if not hit.include or hit.index is None:
            return None
        if hit.index >= len(DENY):
            pattern = NEVER[hit.index - len(DENY)]
            return f"VCS data or a virtualenv: matches {pattern!r}; never shipped"
        return f"secret: matches {DENY[hit.index]!r}; never shipped, whatever the ignore files say"

    def ignored(self, rel: str) -> str | None:
        hit = self.ignore.check_file(rel)
        if not hit.include:
            return None
        if hit.index is None or len(self.ignore.patterns) != len(self.sources):
            return "ignore rules"  # cannot name the line; never expected
        pattern, source = self.sources[hit.index]
        return f"{source}: {pattern!r}"


def _reason(rules: _Rules, rel: str, mode: int, path: Path) -> str | None:
    """Why the entry at ``rel`` (``path``; ``lstat`` mode) does not ship; None if it does."""
    where = f"{rel}/" if stat.S_ISDIR(mode) else rel
    denied = rules.denied(where)
    if denied:
        return denied
    if stat.S_ISLNK(mode):
        return SYMLINK_REASON
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        return "not a regular file (FIFO, socket or device)"
    ignored = rules.ignored(where)
    if ignored or not _checks_content(rel):
        return ignored
    return _private_key(path)


def _private_key(path: Path) -> str | None:
    """PRIVATE_KEY_REASON when the file holds a private key (or cannot be read to tell)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        return f"cannot read it to check for a private key ({e.strerror}); not shipped"
    with os.fdopen(fd, "rb") as f:
        scan = _KeyScan()
        while chunk := f.read(_CHUNK):
            if scan.feed(chunk):
                return PRIVATE_KEY_REASON
    return None


def _checks_content(rel: str) -> bool:
    """Whether the file at ``rel`` is read for a private key before it ships."""
    return rel.lower().endswith(".json")


class _KeyScan:
    """Finds ``PRIVATE_KEY`` in a stream of chunks, also across two chunks."""

    def __init__(self) -> None:
        self.tail = b""

    def feed(self, chunk: bytes) -> bool:
        seen = self.tail + chunk
        self.tail = seen[-(len(PRIVATE_KEY) - 1) :]
        return PRIVATE_KEY in seen


def plan_working_dir(root: Path) -> Plan:
    """What shipping ``root`` would send: nothing is read but names, ``lstat`` and the
    content of ``*.json`` files (for a private key)."""
    rules, plan = _Rules(root), Plan(root)

    def unreadable(e: OSError) -> None:
        where = Path(e.filename).relative_to(root).as_posix() if e.filename else "."
        plan.left_out.append(LeftOut(f"{where}/", f"cannot list this folder: {e.strerror}"))

    for folder, dirs, files in os.walk(root, onerror=unreadable):  # no symlinked folders
        base = Path(folder)
        rel = base.relative_to(root)
        kept = []
        for d in sorted(dirs):
            where = (rel / d).as_posix()
            mode = os.lstat(base / d).st_mode
            reason = _reason(rules, where, mode, base / d)
            if reason:
                plan.left_out.append(LeftOut(f"{where}/", reason))
            else:
                kept.append(d)
        dirs[:] = kept
        for name in sorted(files):
            where = (rel / name).as_posix()
            st = os.lstat(base / name)
            reason = _reason(rules, where, st.st_mode, base / name)
            if reason:
                plan.left_out.append(LeftOut(where, reason))
            else:
                plan.ship.append(where)
                plan.bytes += st.st_size
    return plan


def _open_beneath(root: Path, rel: str) -> int:
    """A read-only descriptor of the regular file ``rel`` under ``root``, every component
    of ``rel`` opened with ``O_NOFOLLOW`` relative to its folder: a symlink anywhere on
    the way (a folder swapped for a link after planning) fails the open (OSError)."""
    *folders, name = rel.split("/")
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in folders:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        return os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    finally:
        os.close(fd)


def _copy_nofollow(root: Path, rel: str, target: Path, budget: int) -> int | None:
    """Copy the regular file ``rel`` under ``root`` (never through a symlink) to
    ``target``: its size, or None when it turned out to hold a private key (``target``
    removed). More than ``budget`` bytes: UsageError."""
    try:
        fd = _open_beneath(root, rel)
    except OSError as e:
        raise UsageError(
            f"--working-dir: cannot read {root / rel} ({e.strerror}); it changed while "
            "being staged (a symlink now?). Nothing was submitted; check it and rerun"
        ) from e
    scan = _KeyScan() if _checks_content(rel) else None
    with os.fdopen(fd, "rb") as f, target.open("xb") as out:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UsageError(f"--working-dir: {root / rel} is no longer a regular file; rerun")
        size, key = 0, False
        while chunk := f.read(_CHUNK):
            key = scan is not None and scan.feed(chunk)
            if key:
                break
            out.write(chunk)
            size += len(chunk)
            if size > budget:
                raise UsageError(
                    f"--working-dir: {root / rel} grew while being staged, past the size "
                    "cap; nothing was submitted; rerun"
                )
    if key:
        target.unlink()
        return None
    return size


def copy_plan(plan: Plan, dest: Path, max_bytes: int) -> Copied:
    """Copy the files ``plan`` ships under ``dest``; UsageError past ``max_bytes``."""
    copied = Copied()
    if plan.root is None:
        return copied
    for where in plan.ship:
        target = dest / where
        target.parent.mkdir(parents=True, exist_ok=True)
        size = _copy_nofollow(plan.root, where, target, max_bytes - copied.bytes)
        if size is None:
            copied.left_out.append(LeftOut(where, PRIVATE_KEY_REASON))
            continue
        copied.files += 1
        copied.bytes += size
    return copied
