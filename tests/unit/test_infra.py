"""infra/: every deploy file parses and points at real things, without Docker or Kubernetes.

Why: nothing in the other tiers executes these files, so a renamed job module, a CLI
command that was never registered, a Ray pin bumped in pyproject.toml but not in an image
tag, or a cluster too small for the shipped stage layout would otherwise first show up on
a cluster at 2 a.m. Each check reads the files the way their tool would (PyYAML, Ray's own
launcher schema, configparser for systemd, the project's config loader and layout check)
and compares them with the one source of versions, pyproject.toml.
"""

from __future__ import annotations

import configparser
import importlib.util
import json
import re
import shlex
import tomllib
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import ray.autoscaler
import yaml

from actors.resources import check_layout
from pipeline.config import (
    CLASSIFY_GPU,
    EMBED_GPU,
    SENTENCIZE_GPU,
    Config,
    FaultsConfig,
    load_config,
)
from pipeline.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
KUBERAY = INFRA / "kuberay"
LAUNCHER = INFRA / "ray-cluster-launcher.yaml"
SYSTEMD = INFRA / "systemd"
CRONTAB = INFRA / "crontab.example"
README = INFRA / "README.md"
CONFIG_DIR = INFRA / "config"
CONFIG_MOUNT = "/etc/docintel"
FLAVORS = ("cpu", "cuda")

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def _pin(name: str) -> str:
    """The exact ``name==X`` pin of a dependency in pyproject.toml."""
    for dep in PROJECT["dependencies"]:
        m = re.fullmatch(rf"{re.escape(name)}(?:\[[\w,-]+\])?==([\w.]+)", dep.strip())
        if m:
            return m.group(1)
    raise AssertionError(f"pyproject.toml has no exact pin {name}==X")


RAY = _pin("ray")
TORCH = _pin("torch")
VERSION = PROJECT["version"]
PY_TAG = "py" + re.fullmatch(r">=\s*(\d+)\.(\d+)", PROJECT["requires-python"]).expand(r"\1\2")

YAML_FILES = sorted({*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")})

# Keys whose values are commands a tool will run (KubeRay, Kubernetes, the launcher).
COMMAND_KEYS = {
    "entrypoint",
    "command",
    "args",
    "initialization_commands",
    "setup_commands",
    "head_setup_commands",
    "worker_setup_commands",
    "head_start_ray_commands",
    "worker_start_ray_commands",
}
IMAGE_KEYS = {"image", "head_image", "worker_image"}
PYTHON_M = re.compile(r"\bpython(?:3(?:\.\d+)?)?\s+-m\s+([A-Za-z_][\w.]*)")
# `docintel SUB` where docintel is the command word (a path to it is fine), not a user
# name, folder or image name: the subcommand must be followed by a word boundary.
DOCINTEL_SUB = re.compile(
    r"(?:^|(?<=[\s;&|(\"'`]))(?:[\w./-]*/)?docintel\s+([a-z][a-z0-9-]*)(?=[\s\"'`);]|$)"
)


# --- helpers ---------------------------------------------------------------------------


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def _docs(path: Path) -> list[Any]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def _kube_objects() -> list[dict[str, Any]]:
    return [d for p in sorted(KUBERAY.glob("*.yaml")) for d in _docs(p)]


def _one(kind: str) -> dict[str, Any]:
    found = [d for d in _kube_objects() if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} under infra/kuberay, found {len(found)}"
    return found[0]


def _walk(node: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    """Every (key, value) pair in a parsed YAML tree; list items inherit their list's key."""
    yield key, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, str(k))
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item, key)


def _yaml_commands(path: Path) -> list[str]:
    """Command strings in a YAML file; list-form commands are joined into one line."""
    out: list[str] = []
    for doc in _docs(path):
        for key, value in _walk(doc):
            if key not in COMMAND_KEYS:
                continue
            if isinstance(value, str):
                out.append(value)
            elif isinstance(value, list) and all(isinstance(v, str) for v in value):
                out.append(" ".join(value))
    return out


def _quantity(q: str | float) -> float:
    """A Kubernetes quantity of CPUs or GPUs: "7", "500m", 1."""
    s = str(q)
    return float(s[:-1]) / 1000 if s.endswith("m") else float(s)


def _pod_containers(group: dict[str, Any]) -> list[dict[str, Any]]:
    return group["template"]["spec"]["containers"]


def _is_gpu(container: dict[str, Any]) -> bool:
    return "nvidia.com/gpu" in container.get("resources", {}).get("limits", {})


def _ray_cpus(group: dict[str, Any]) -> float:
    """CPUs Ray sees on a pod of this group: num-cpus if given, else the CPU limit."""
    params = group.get("rayStartParams", {})
    if "num-cpus" in params:
        return float(params["num-cpus"])
    return _quantity(_pod_containers(group)[0]["resources"]["limits"]["cpu"])


def _ray_gpus(group: dict[str, Any]) -> float:
    params = group.get("rayStartParams", {})
    if "num-gpus" in params:
        return float(params["num-gpus"])
    return _quantity(_pod_containers(group)[0]["resources"]["limits"].get("nvidia.com/gpu", 0))


def _min_size(spec: dict[str, Any]) -> tuple[float, float]:
    """(CPUs, GPUs) of a RayCluster spec at its minimum size, as the driver sees them."""
    cpus, gpus = _ray_cpus(spec["headGroupSpec"]), _ray_gpus(spec["headGroupSpec"])
    for group in spec["workerGroupSpecs"]:
        n = group.get("minReplicas", 0)
        cpus += n * _ray_cpus(group)
        gpus += n * _ray_gpus(group)
    return cpus, gpus


def _cluster_config(name: str) -> Config:
    return load_config(CONFIG_DIR / name)


# --- cron ------------------------------------------------------------------------------

_MONTHS = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_DAYS = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"]
_CRON_FIELDS: list[tuple[int, int, list[str], int]] = [
    (0, 59, [], 0),  # minute
    (0, 23, [], 0),  # hour
    (1, 31, [], 0),  # day of month
    (1, 12, _MONTHS, 1),  # month (names map to 1..12)
    (0, 7, _DAYS, 0),  # day of week (0 and 7 are Sunday)
]


def _cron_value(token: str, lo: int, hi: int, names: list[str], offset: int) -> int | None:
    if token.lower() in names:
        return names.index(token.lower()) + offset
    if token.isdigit() and lo <= int(token) <= hi:
        return int(token)
    return None


def cron_is_valid(expr: str) -> bool:
    """A standard 5-field cron schedule (numbers, names, ranges, lists, steps, *)."""
    fields = expr.split()
    if len(fields) != 5:
        return False
    for text, (lo, hi, names, offset) in zip(fields, _CRON_FIELDS, strict=True):
        for item in text.split(","):
            base, _, step = item.partition("/")
            if step and not (step.isdigit() and int(step) >= 1):
                return False
            if base == "*":
                continue
            first, _, last = base.partition("-")
            a = _cron_value(first, lo, hi, names, offset)
            b = _cron_value(last, lo, hi, names, offset) if last else a
            if a is None or b is None or a > b:
                return False
    return True


# --- Dockerfiles -----------------------------------------------------------------------


@dataclass
class Dockerfile:
    path: Path
    args: dict[str, str] = field(default_factory=dict)  # ARG defaults, substituted
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTR, rest)
    comments: list[str] = field(default_factory=list)

    def subst(self, text: str) -> str:
        return re.sub(
            r"\$\{(\w+)\}|\$(\w+)",
            lambda m: self.args.get(m.group(1) or m.group(2), m.group(0)),
            text,
        )

    def all(self, instr: str) -> list[str]:
        return [rest for i, rest in self.instructions if i == instr]

    @property
    def base(self) -> str:
        return self.subst(self.all("FROM")[0].split()[0])

    @property
    def documented_image(self) -> str:
        """The image the Dockerfile's header says to build (`docker build ... -t IMAGE .`)."""
        pattern = rf"docker build -f {re.escape(_rel(self.path))} -t (\S+) \.$"
        found = [m.group(1) for c in self.comments if (m := re.search(pattern, c.strip()))]
        assert len(found) == 1, f"{_rel(self.path)}: no single 'docker build -t' line"
        return found[0]


def _parse_dockerfile(path: Path) -> Dockerfile:
    df = Dockerfile(path)
    buf = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("#"):
            df.comments.append(line.lstrip("# ").rstrip())
            continue
        if not line and not buf:
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        instr, _, rest = buf.partition(" ")
        instr, rest = instr.upper(), rest.strip()
        df.instructions.append((instr, rest))
        if instr == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            df.args.setdefault(name, df.subst(default))
        buf = ""
    return df


DOCKERFILES = {f: _parse_dockerfile(INFRA / f"Dockerfile.{f}") for f in FLAVORS}


def _image_for(flavor: str) -> str:
    return DOCKERFILES[flavor].documented_image


# --- every file parses -----------------------------------------------------------------


def test_the_deploy_files_exist() -> None:
    expected = [
        "Dockerfile.cpu",
        "Dockerfile.cuda",
        "kuberay/raycluster.yaml",
        "kuberay/rayjob.yaml",
        "kuberay/cronjob-audit.yaml",
        "kuberay/configmap.yaml",
        "ray-cluster-launcher.yaml",
        "systemd/docintel-audit.service",
        "systemd/docintel-audit.timer",
        "crontab.example",
        "config/job.toml",
        "config/audit.toml",
        "README.md",
    ]
    missing = [p for p in expected if not (INFRA / p).is_file()]
    assert not missing, f"missing under infra/: {missing}"


@pytest.mark.parametrize("path", YAML_FILES, ids=_rel)
def test_every_yaml_file_parses(path: Path) -> None:
    docs = _docs(path)
    assert docs, f"{_rel(path)} holds no YAML document"
    assert all(isinstance(d, dict) for d in docs), f"{_rel(path)}: a document is not a mapping"
    for d in docs:
        if path.parent == KUBERAY:
            assert {"apiVersion", "kind", "metadata"} <= d.keys(), _rel(path)


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.toml")), ids=_rel)
def test_every_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.faults == FaultsConfig(), f"{_rel(path)} sets test-only [faults]"
    assert cfg.job.input or cfg.audit.source, f"{_rel(path)} sets neither [job] nor [audit]"


# --- versions and images ---------------------------------------------------------------


@pytest.mark.parametrize("flavor", FLAVORS)
def test_dockerfile_pins_match_pyproject(flavor: str) -> None:
    df = DOCKERFILES[flavor]
    assert df.args["RAY_VERSION"] == RAY, f"Dockerfile.{flavor} RAY_VERSION vs pyproject"
    assert df.args["TORCH_VERSION"] == TORCH, f"Dockerfile.{flavor} TORCH_VERSION vs pyproject"
    assert df.args["DOCINTEL_VERSION"] == VERSION, f"Dockerfile.{flavor} DOCINTEL_VERSION"
    if flavor == "cpu":
        assert df.base == f"rayproject/ray:{RAY}-{PY_TAG}-cpu"
        assert df.args["TORCH_INDEX_URL"].endswith("/cpu")
    else:
        m = re.fullmatch(rf"rayproject/ray:{re.escape(RAY)}-{PY_TAG}-(cu\d+)", df.base)
        assert m, f"Dockerfile.cuda base {df.base!r} is not Ray {RAY}'s {PY_TAG} CUDA image"
        assert df.args["TORCH_INDEX_URL"].endswith("/" + m.group(1)), "torch CUDA != base CUDA"
    # The documented tag is <project version>-ray<Ray>-<flavor>, and the label says so too.
    image = df.documented_image
    assert image.rsplit("/", 1)[-1] == f"docintel:{VERSION}-ray{RAY}-{flavor}"
    labels = " ".join(df.subst(x) for x in df.all("LABEL"))
    assert f'org.opencontainers.image.version="{VERSION}-ray{RAY}-{flavor}"' in labels


@pytest.mark.parametrize("flavor", FLAVORS)
def test_dockerfile_installs_at_build_time_and_quantizes(flavor: str) -> None:
    df = DOCKERFILES[flavor]
    runs = df.all("RUN")
    install = next(i for i, r in enumerate(runs) if re.search(r"pip install .*-e \.", r))
    quantize = [i for i, r in enumerate(runs) if "docintel quantize" in r]
    assert quantize, f"Dockerfile.{flavor} does not build the int8 encoder"
    assert quantize[0] > install, "docintel quantize must run after docintel is installed"
    assert "--out" not in runs[quantize[0]], "the artefact must land at the default path"
    env = " ".join(df.all("ENV"))
    for var in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"):
        assert var in env, f"Dockerfile.{flavor} does not set {var}"
    # `ray up` starts containers as `docker run IMAGE bash`: an ENTRYPOINT would break it.
    assert not df.all("ENTRYPOINT"), f"Dockerfile.{flavor} must not set an ENTRYPOINT"
    assert all("pip" not in c for c in df.all("CMD")), "no installs at container start"
    if flavor == "cuda":
        assert "tensorflow-cpu" in " ".join(runs), "the CUDA image must leave out tensorflow-cpu"


@pytest.mark.parametrize("flavor", FLAVORS)
def test_dockerfile_copies_real_paths_within_its_context(flavor: str) -> None:
    df = DOCKERFILES[flavor]
    ignore = INFRA / f"Dockerfile.{flavor}.dockerignore"
    allowed = {
        line[1:].strip("/")
        for line in ignore.read_text(encoding="utf-8").splitlines()
        if line.startswith("!")
    }
    assert "**" in ignore.read_text(encoding="utf-8").splitlines(), "context must be allowlisted"
    for rest in df.all("COPY"):
        tokens = [t for t in shlex.split(rest) if not t.startswith("--")]
        for src in tokens[:-1]:
            assert (REPO / src).exists(), f"Dockerfile.{flavor} copies missing {src}"
            assert src.strip("/") in allowed, f"{src} is excluded by {_rel(ignore)}"


def test_every_image_is_a_documented_docintel_image_of_the_right_flavor() -> None:
    documented = {_image_for(f) for f in FLAVORS}
    seen: list[str] = []
    for path in YAML_FILES:
        for doc in _docs(path):
            for key, value in _walk(doc):
                if key in IMAGE_KEYS and isinstance(value, str):
                    seen.append(value)
                    assert value in documented, f"{_rel(path)} uses undocumented image {value}"
    assert len(seen) >= 8
    # Containers holding a GPU run the CUDA image; all others the CPU image.
    for obj in _kube_objects():
        for key, value in _walk(obj):
            if key == "containers" and isinstance(value, list):
                for c in value:
                    want = _image_for("cuda" if _is_gpu(c) else "cpu")
                    assert c["image"] == want, f"{obj['kind']} container {c['name']}"


def test_ray_version_everywhere_equals_the_pyproject_pin() -> None:
    versions = [
        (_rel(p), v) for p in YAML_FILES for d in _docs(p) for k, v in _walk(d) if k == "rayVersion"
    ]
    assert len(versions) == 2, versions  # the RayCluster and the RayJob's cluster
    assert all(v == RAY for _, v in versions), f"rayVersion vs ray=={RAY}: {versions}"
    launcher = yaml.safe_load(LAUNCHER.read_text(encoding="utf-8"))
    checks = [c for c in launcher["setup_commands"] if "ray.__version__" in c]
    assert checks and all(f"'{RAY}'" in c for c in checks), "launcher must check Ray " + RAY


# --- KubeRay ---------------------------------------------------------------------------


def _cluster_specs() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("RayCluster", _one("RayCluster")["spec"]),
        ("RayJob", _one("RayJob")["spec"]["rayClusterSpec"]),
    ]


def _configmaps() -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d["data"] for d in _kube_objects() if d["kind"] == "ConfigMap"}


def _mounted_config(group: dict[str, Any]) -> dict[str, str]:
    """The ConfigMap data a pod of this group sees at /etc/docintel."""
    pod = group["template"]["spec"]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    mounts = [
        m
        for c in pod["containers"]
        for m in c.get("volumeMounts", [])
        if m["mountPath"] == CONFIG_MOUNT
    ]
    assert mounts, f"nothing mounted at {CONFIG_MOUNT}"
    name = volumes[mounts[0]["name"]]["configMap"]["name"]
    maps = _configmaps()
    assert name in maps, f"ConfigMap {name} is not defined under infra/kuberay"
    return maps[name]


@pytest.mark.parametrize("kind", ["RayCluster", "RayJob"])
def test_cluster_shape(kind: str) -> None:
    spec = dict(_cluster_specs())[kind]
    head = spec["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0", "no work may be scheduled on the head"
    ports = {p["containerPort"] for c in _pod_containers(head) for p in c.get("ports", [])}
    assert 8265 in ports, "the dashboard / Jobs API port"
    groups = spec["workerGroupSpecs"]
    gpu = [g for g in groups if any(_is_gpu(c) for c in _pod_containers(g))]
    cpu = [g for g in groups if g not in gpu]
    assert len(gpu) == 1 and cpu, "one GPU worker group and a CPU worker group"
    (g,) = gpu
    assert _ray_gpus(g) == 1, "one card per GPU worker, shared by the three stages"
    for group in [head, *groups]:
        params = group["rayStartParams"]
        assert all(isinstance(v, str) for v in params.values()), "KubeRay wants string params"
        for c in _pod_containers(group):
            res = c["resources"]
            for part in ("requests", "limits"):
                assert {"cpu", "memory"} <= res[part].keys(), f"{c['name']} {part}"
            secrets = [e["secretRef"]["name"] for e in c.get("envFrom", []) if "secretRef" in e]
            assert secrets == ["docintel-aws"], f"{kind} {c['name']}: AWS credentials Secret"
        assert {"job.toml", "audit.toml"} <= _mounted_config(group).keys()
    for group in groups:
        assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


@pytest.mark.parametrize(("kind", "toml"), [("RayCluster", "audit.toml"), ("RayJob", "job.toml")])
def test_cluster_min_size_fits_the_shipped_layout(kind: str, toml: str) -> None:
    """The driver checks the layout against the cluster's resources at start, before the
    autoscaler can add anything, so the minimum size must already fit it."""
    spec = dict(_cluster_specs())[kind]
    cfg = _cluster_config(toml)
    check_layout(cfg, *_min_size(spec))
    # ... and it is the GPU group's minimum that makes it fit: without its GPU, refused.
    cpus, _ = _min_size(spec)
    with pytest.raises(ConfigError, match="GPU replicas need"):
        check_layout(cfg, cpus, 0.0)


def test_configmap_is_infra_config_verbatim() -> None:
    data = _configmaps()["docintel-config"]
    for name in ("job.toml", "audit.toml"):
        assert data[name] == (CONFIG_DIR / name).read_text(encoding="utf-8"), (
            f"infra/kuberay/configmap.yaml {name} differs from infra/config/{name}: "
            "regenerate it (infra/README.md)"
        )


def test_rayjob_runs_the_batch_job_and_cleans_up() -> None:
    job = _one("RayJob")["spec"]
    assert job["entrypoint"] == f"python -m jobs.batch --config {CONFIG_MOUNT}/job.toml"
    assert job["shutdownAfterJobFinishes"] is True
    assert isinstance(job["ttlSecondsAfterFinished"], int)
    assert "job.toml" in _mounted_config(job["rayClusterSpec"]["headGroupSpec"])


def test_cronjob_submits_the_audit_to_the_raycluster_head() -> None:
    cron = _one("CronJob")
    assert cron["apiVersion"] == "batch/v1"
    spec = cron["spec"]
    assert cron_is_valid(spec["schedule"]), spec["schedule"]
    assert spec["concurrencyPolicy"] == "Forbid"
    zoneinfo.ZoneInfo(spec["timeZone"])  # raises for an unknown zone
    job = spec["jobTemplate"]["spec"]
    assert isinstance(job["backoffLimit"], int) and job["backoffLimit"] >= 0
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] in {"Never", "OnFailure"}
    command = " ".join(_yaml_commands(KUBERAY / "cronjob-audit.yaml"))
    cluster = _one("RayCluster")
    head = cluster["spec"]["headGroupSpec"]
    assert "ray job submit" in command
    assert f"--address http://{cluster['metadata']['name']}-head-svc:8265" in command
    assert f"python -m jobs.nightly_audit --config {CONFIG_MOUNT}/audit.toml" in command
    assert "audit.toml" in _mounted_config(head), "the driver runs on the head pod"


def test_no_credentials_or_runtime_installs_in_any_manifest() -> None:
    for path in YAML_FILES:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"AKIA[0-9A-Z]{16}", text), f"{_rel(path)}: an AWS key id"
        for doc in _docs(path):
            assert doc.get("kind") != "Secret", f"{_rel(path)}: Secrets are created, not kept"
            for key, value in _walk(doc):
                if key == "env":
                    for e in value:
                        if re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY", e["name"]):
                            assert "value" not in e, f"{_rel(path)}: literal {e['name']}"
                if key == "runtimeEnvYAML":
                    assert "pip" not in value, f"{_rel(path)}: pip at run time"
        for command in _yaml_commands(path):
            assert "pip install" not in command, f"{_rel(path)}: installs at run time"


# --- entrypoints exist -----------------------------------------------------------------


def _systemd(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
    return parser


def _crontab_entries() -> list[tuple[str, str]]:
    """(schedule, command) of each job line of infra/crontab.example."""
    entries = []
    for raw in CRONTAB.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or re.match(r"[A-Za-z_]\w*=", line):
            continue
        fields = line.split(maxsplit=5)
        assert len(fields) == 6, f"crontab line without a command: {line!r}"
        entries.append((" ".join(fields[:5]), fields[5]))
    return entries


def _readme_code_lines() -> list[str]:
    lines, inside = [], False
    for line in README.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(re.sub(r"\s+#.*$", "", line))
    return lines


def _all_commands() -> list[tuple[str, str]]:
    """(file, command) for everything a deploy tool or an operator runs."""
    out = [(_rel(p), c) for p in YAML_FILES for c in _yaml_commands(p)]
    for unit in sorted(SYSTEMD.glob("*.service")):
        for section in _systemd(unit).values():
            out += [(_rel(unit), v) for k, v in section.items() if k.startswith("Exec")]
    out += [(_rel(CRONTAB), c) for _, c in _crontab_entries()]
    for df in DOCKERFILES.values():
        out += [(_rel(df.path), r) for r in df.all("RUN")]
        out += [(_rel(df.path), " ".join(json.loads(c))) for c in df.all("CMD")]
    out += [(_rel(README), line) for line in _readme_code_lines()]
    return out


def _registered_commands() -> set[str]:
    import typer

    from jobs.cli import app

    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_cron_validator_rejects_bad_schedules() -> None:
    for good in ["0 2 * * *", "*/15 * * * *", "0 2 * * mon-fri", "30 4 1,15 jan-jun 0"]:
        assert cron_is_valid(good), good
    for bad in ["0 2 * *", "60 2 * * *", "0 24 * * *", "0 2 0 * *", "0 2 * * mon-xyz", "@daily"]:
        assert not cron_is_valid(bad), bad


def test_every_python_module_named_exists() -> None:
    named = {(f, m) for f, c in _all_commands() for m in PYTHON_M.findall(c)}
    modules = {m for _, m in named}
    assert {"jobs.batch", "jobs.nightly_audit"} <= modules, modules
    missing = sorted(f"{m} (in {f})" for f, m in named if importlib.util.find_spec(m) is None)
    assert not missing, f"`python -m` names modules that do not exist: {missing}"


def test_every_docintel_subcommand_named_is_registered() -> None:
    named = {(f, s) for f, c in _all_commands() for s in DOCINTEL_SUB.findall(c)}
    subs = {s for _, s in named}
    assert {"audit", "quantize", "submit"} <= subs, subs
    registered = _registered_commands()
    missing = sorted(f"docintel {s} (in {f})" for f, s in named if s not in registered)
    assert not missing, f"not registered on jobs.cli.app ({sorted(registered)}): {missing}"


# --- one machine: systemd and cron -----------------------------------------------------


def test_systemd_units_parse_and_the_timer_names_the_service() -> None:
    service_path = SYSTEMD / "docintel-audit.service"
    service = _systemd(service_path)
    assert service["Service"]["Type"] == "oneshot"
    exec_start = shlex.split(service["Service"]["ExecStart"])
    assert Path(exec_start[0]).is_absolute(), "systemd needs an absolute ExecStart"
    assert exec_start[1:] == ["audit", "--config", f"{CONFIG_MOUNT}/audit.toml"]
    assert service["Service"]["User"], "never run the audit as root"
    timer = _systemd(SYSTEMD / "docintel-audit.timer")
    assert timer["Timer"]["Unit"] == service_path.name
    assert (SYSTEMD / timer["Timer"]["Unit"]).is_file()
    assert timer["Timer"]["OnCalendar"].startswith("*-*-* 02:00:00")
    assert timer["Install"]["WantedBy"] == "timers.target"


def test_crontab_schedules_the_audit_like_the_cronjob() -> None:
    entries = _crontab_entries()
    assert len(entries) == 1
    ((schedule, command),) = entries
    assert cron_is_valid(schedule), schedule
    assert schedule == _one("CronJob")["spec"]["schedule"], "one nightly time everywhere"
    assert f"docintel audit --config {CONFIG_MOUNT}/audit.toml" in command


# --- configs ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["job.toml", "audit.toml"])
def test_cluster_configs_join_the_cluster_with_a_gpu_and_spill_layout(name: str) -> None:
    cfg = _cluster_config(name)
    assert cfg.run.ray_address == "auto", "a job on a cluster must join it, not embed Ray"
    job, audit = cfg.job, cfg.audit
    uris = [job.input, job.output] if name == "job.toml" else [audit.source, audit.output]
    assert all(u.startswith("s3://") for u in uris), uris
    r = cfg.resources
    defaults = {"sentencize": SENTENCIZE_GPU, "embed": EMBED_GPU, "classify": CLASSIFY_GPU}
    for stage, fraction in defaults.items():
        pool = getattr(r, stage)
        assert pool.gpu_replicas >= 1 and pool.replicas >= 1, f"{stage}: GPU pool + spill pool"
        assert pool.gpu_fraction == fraction, f"{stage}: the default fraction"
    assert sum(defaults.values()) <= 1.0
    assert cfg.run.spill == "auto" and cfg.embed.cpu_precision == "auto"  # int8 spill replicas


def test_local_audit_config_embeds_ray() -> None:
    cfg = _cluster_config("audit-local.toml")
    assert cfg.run.ray_address == "", "the single-machine audit starts its own Ray"
    assert cfg.audit.source and cfg.audit.output
    check_layout(cfg, 2.0)  # the default pools fit a two-core machine


# --- the Ray cluster launcher ----------------------------------------------------------


def test_launcher_config_is_valid_for_ray_and_fits_the_layout() -> None:
    config = yaml.safe_load(LAUNCHER.read_text(encoding="utf-8"))
    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    jsonschema.validate(config, json.loads(schema_path.read_text(encoding="utf-8")))

    assert config["docker"]["image"] == _image_for("cpu")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"]["CPU"] == 0
    assert any("--head" in c and "--num-cpus=0" in c for c in config["head_start_ray_commands"])
    workers = {k: v for k, v in types.items() if k != config["head_node_type"]}
    gpu = [v for v in workers.values() if v["resources"].get("GPU", 0) > 0]
    assert len(gpu) == 1 and gpu[0]["resources"]["GPU"] == 1
    assert gpu[0]["docker"]["worker_image"] == _image_for("cuda")
    for node in workers.values():
        if node not in gpu:
            assert node.get("docker", {}).get("worker_image", _image_for("cpu")) == _image_for(
                "cpu"
            )
    assert sum(v["max_workers"] for v in workers.values()) <= config["max_workers"]

    local = config["file_mounts"][CONFIG_MOUNT]
    assert (REPO / local).resolve() == CONFIG_DIR, "infra/config at /etc/docintel"
    cpus = sum(v.get("min_workers", 0) * v["resources"].get("CPU", 0) for v in workers.values())
    gpus = sum(v.get("min_workers", 0) * v["resources"].get("GPU", 0) for v in workers.values())
    for name in ("job.toml", "audit.toml"):
        check_layout(_cluster_config(name), float(cpus), float(gpus))


# --- the operator's guide --------------------------------------------------------------


def test_readme_names_every_file_and_the_build_commands() -> None:
    text = README.read_text(encoding="utf-8")
    files = [p for p in INFRA.rglob("*") if p.is_file() and p != README]
    unnamed = [_rel(p) for p in files if _rel(p) not in text]
    assert not unnamed, f"infra/README.md does not explain {unnamed}"
    for flavor in FLAVORS:
        build = f"docker build -f infra/Dockerfile.{flavor} -t {_image_for(flavor)} ."
        assert build in text, f"README lacks: {build}"
    for step in [
        "kubectl create secret generic docintel-aws",
        "kubectl apply -f infra/kuberay/raycluster.yaml",
        "kubectl apply -f infra/kuberay/rayjob.yaml",
        "kubectl apply -f infra/kuberay/cronjob-audit.yaml",
        "ray up -y infra/ray-cluster-launcher.yaml",
        "systemctl enable --now docintel-audit.timer",
        "crontab -u docintel infra/crontab.example",
    ]:
        assert step in text, f"README lacks: {step}"
