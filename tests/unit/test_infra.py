"""infra/: every deploy file parses and points at real things, without Docker or Kubernetes.

Why: nothing in the other tiers executes these files, so a renamed job module, a CLI
command that was never registered, a Ray pin bumped in pyproject.toml but not in an image
tag, or a cluster too small for the shipped stage layout would otherwise first show up on
a cluster at 2 a.m. Each check reads the files the way their tool would (PyYAML, Ray's own
launcher schema, configparser for systemd, the project's config loader and layout check)
and compares them with the one source of versions, pyproject.toml.

The security settings are checked the same way, on the parsed YAML: token authentication
on every Ray process and submitter, the NetworkPolicies, each container's
securityContext, workload identity instead of AWS keys, no secret on a command line,
images by digest (or the documented pin procedure), the launcher's AMI and auth. A
manifest edit that drops one of them fails here, not in a security review.

The Grafana dashboard is checked against the metrics the code defines (actors/metrics.py),
under the names Ray's Prometheus endpoint gives them, so a renamed metric cannot leave a
silently empty panel.
"""

from __future__ import annotations

import ast
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

from docintel.actors.resources import check_layout
from docintel.pipeline.config import (
    Config,
    FaultsConfig,
    load_config,
)
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.registry import BUILTIN
from docintel.pipeline.run.layout import (
    CPU_POOL,
    GPU_POOL,
    ClusterShape,
    NodeShape,
    Pool,
    stage_layout,
)

# The stages the cluster configs size GPU and spill pools for: those with a share of a
# card (the optional and CPU-only stages, parse, privacy, entities, language, run in CPU
# pools the layout sizes alone).
STAGES = tuple(s.name for s in BUILTIN if s.pool.gpu_share)
INT8_STAGES = tuple(s.name for s in BUILTIN if s.int8)  # stages with an int8 CPU backend

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
KUBERAY = INFRA / "kuberay"
LAUNCHER = INFRA / "ray-cluster-launcher.yaml"
SYSTEMD = INFRA / "systemd"
CRONTAB = INFRA / "crontab.example"
README = INFRA / "README.md"
DASHBOARD = INFRA / "grafana" / "docintel-dashboard.json"
METRICS_MODULE = REPO / "actors" / "metrics.py"
CONFIG_DIR = INFRA / "config"
CONFIG_MOUNT = "/etc/docintel"
FLAVORS = ("cpu", "cuda")
SERVICE_ACCOUNTS = KUBERAY / "serviceaccounts.yaml"
NETWORK_POLICIES = KUBERAY / "networkpolicy.yaml"
TOKEN_SECRET = "docintel-ray-auth"  # the Secret holding Ray's token, key auth_token
TOKEN_KEY = "auth_token"  # the key KubeRay's authOptions.secretName expects
RAY_CLUSTER_LABEL = "docintel/ray-cluster"  # on every Ray pod template: <cluster>
SUBMITTER_LABEL = "docintel/ray-submitter"  # on every submitter pod template: "true"
IRSA_ANNOTATION = "eks.amazonaws.com/role-arn"
RAY_USER = 1000  # the rayproject image's `ray` user
DASHBOARD_PORT = 8265
API_TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"  # where clients look
NAMESPACE_LABEL = "kubernetes.io/metadata.name"  # set by Kubernetes on every namespace
# A digest suffix an image reference may carry after its documented tag.
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")

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


def _group_shape(spec: dict[str, Any], size: str) -> ClusterShape:
    """The Ray nodes of a RayCluster spec with each worker group at ``size``
    (minReplicas / maxReplicas), as the driver sees them: the head, then each worker."""
    head = spec["headGroupSpec"]
    nodes = [NodeShape(_ray_cpus(head), _ray_gpus(head))]
    for group in spec["workerGroupSpecs"]:
        nodes += [NodeShape(_ray_cpus(group), _ray_gpus(group))] * group.get(size, 0)
    return ClusterShape(tuple(nodes))


def _min_shape(spec: dict[str, Any]) -> ClusterShape:
    """A RayCluster spec at its minimum size: what a run finds when it starts."""
    return _group_shape(spec, "minReplicas")


def _max_shape(spec: dict[str, Any]) -> ClusterShape:
    """A RayCluster spec with every group at maxReplicas: what the autoscaler can reach."""
    return _group_shape(spec, "maxReplicas")


def _without_gpus(shape: ClusterShape) -> ClusterShape:
    return ClusterShape(tuple(NodeShape(n.cpus) for n in shape.nodes))


def _launcher_shape(config: dict[str, Any], size: str) -> ClusterShape:
    """The launcher's nodes with each node type at ``size`` (min_workers / max_workers)."""
    types = config["available_node_types"]
    head = types[config["head_node_type"]]["resources"]
    nodes = [NodeShape(float(head.get("CPU", 0)), float(head.get("GPU", 0)))]
    for name, node in types.items():
        if name != config["head_node_type"]:
            res = node["resources"]
            shape = NodeShape(float(res.get("CPU", 0)), float(res.get("GPU", 0)))
            nodes += [shape] * node.get(size, 0)
    return ClusterShape(tuple(nodes))


def _fits(cfg: Config, shape: ClusterShape) -> dict[str, list[Pool]]:
    """The layout the driver sizes for ``shape``, after its own start check."""
    layout = stage_layout(cfg, shape)
    check_layout(cfg, layout, shape)
    return layout


def _pools(layout: dict[str, list[Pool]]) -> dict[tuple[str, str], Pool]:
    return {(p.stage, p.kind): p for pools in layout.values() for p in pools}


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


def _tag_part(image: str) -> str:
    """The image reference without a trailing ``@sha256:<digest>`` pin."""
    return DIGEST.sub("", image)


# --- every file parses -----------------------------------------------------------------


def test_the_deploy_files_exist() -> None:
    expected = [
        "Dockerfile.cpu",
        "Dockerfile.cuda",
        "kuberay/raycluster.yaml",
        "kuberay/rayjob.yaml",
        "kuberay/cronjob-audit.yaml",
        "kuberay/configmap.yaml",
        "kuberay/serviceaccounts.yaml",
        "kuberay/networkpolicy.yaml",
        "ray-cluster-launcher.yaml",
        "systemd/docintel-audit.service",
        "systemd/docintel-audit.timer",
        "crontab.example",
        "config/job.toml",
        "config/audit.toml",
        "grafana/docintel-dashboard.json",
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
    base = _tag_part(df.base)  # a RAY_BASE_DIGEST default would pin it further
    if flavor == "cpu":
        assert base == f"rayproject/ray:{RAY}-{PY_TAG}-cpu"
        assert df.args["TORCH_INDEX_URL"].endswith("/cpu")
    else:
        m = re.fullmatch(rf"rayproject/ray:{re.escape(RAY)}-{PY_TAG}-(cu\d+)", base)
        assert m, f"Dockerfile.cuda base {base!r} is not Ray {RAY}'s {PY_TAG} CUDA image"
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
    # a regular install (not editable): the docintel.* namespace and its package data
    install = next(i for i, r in enumerate(runs) if re.search(r"pip install [^&]* \.( |$)", r))
    assert not any(re.search(r"pip install .*-e \.", r) for r in runs), "editable install"
    quantize = [i for i, r in enumerate(runs) if "docintel quantize" in r]
    assert quantize, f"Dockerfile.{flavor} does not build the int8 encoder"
    assert quantize[0] > install, "docintel quantize must run after docintel is installed"
    assert "--out" not in runs[quantize[0]], "the artefact must land at the default path"
    env = " ".join(df.all("ENV"))
    for var in ("HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1", "DOCINTEL_CACHE_DIR=/"):
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
                    # the documented tag, optionally pinned by digest (infra/README.md)
                    image = _tag_part(value)
                    assert image in documented, f"{_rel(path)} uses undocumented image {value}"
    assert len(seen) >= 8
    # Containers holding a GPU run the CUDA image; all others the CPU image.
    for obj in _kube_objects():
        for key, value in _walk(obj):
            if key == "containers" and isinstance(value, list):
                for c in value:
                    want = _image_for("cuda" if _is_gpu(c) else "cpu")
                    assert _tag_part(c["image"]) == want, f"{obj['kind']} container {c['name']}"


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
        assert {"job.toml", "audit.toml"} <= _mounted_config(group).keys()
    for group in groups:
        assert 1 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"]


# Which config each cluster runs: the CronJob submits the audit to the RayCluster, the
# RayJob runs the batch job on its own cluster.
CLUSTER_CONFIGS = [("RayCluster", "audit.toml"), ("RayJob", "job.toml")]


@pytest.mark.parametrize(("kind", "toml"), CLUSTER_CONFIGS)
def test_cluster_min_size_fits_the_shipped_layout(kind: str, toml: str) -> None:
    """The driver checks the layout against the cluster's nodes at start, before the
    autoscaler can add anything, so the minimum size must already fit it."""
    spec = dict(_cluster_specs())[kind]
    cfg = _cluster_config(toml)
    shape = _min_shape(spec)
    check_layout(cfg, stage_layout(cfg, shape), shape)
    # ... and it is the GPU group's minimum that makes it fit: without its GPU, refused.
    no_gpu = _without_gpus(shape)
    with pytest.raises(ConfigError, match="GPU replicas need"):
        check_layout(cfg, stage_layout(cfg, no_gpu), no_gpu)


def _gpu_group(spec: dict[str, Any]) -> dict[str, Any]:
    (group,) = [g for g in spec["workerGroupSpecs"] if any(_is_gpu(c) for c in _pod_containers(g))]
    return group


@pytest.mark.parametrize(("kind", "toml"), CLUSTER_CONFIGS)
def test_pool_bounds_follow_the_worker_groups(kind: str, toml: str) -> None:
    """min_* / max_* are the groups' minReplicas / maxReplicas: the run starts on the
    minimum size, asks the autoscaler for the rest (pending replicas up to max_*), and the
    groups at their maximum hold every one of them (none pending for the whole run). The
    CPU pools' max_replicas is what the CPU group's workers hold at maxReplicas."""
    spec = dict(_cluster_specs())[kind]
    cfg = _cluster_config(toml)
    gpu = _gpu_group(spec)
    per_worker = int(_ray_gpus(gpu))  # one GPU replica per stage per card
    at_min, at_max = _pools(_fits(cfg, _min_shape(spec))), _pools(_fits(cfg, _max_shape(spec)))
    cpu_group = {**spec, "workerGroupSpecs": [g for g in spec["workerGroupSpecs"] if g != gpu]}
    uncapped = cfg.model_copy(
        update={
            "resources": cfg.resources.model_copy(
                update={
                    s: getattr(cfg.resources, s).model_copy(update={"max_replicas": 0})
                    for s in STAGES
                }
            )
        }
    )
    cpu_workers_hold = _pools(stage_layout(uncapped, _max_shape(cpu_group)))
    asks_for_more = False
    for stage in STAGES:
        pool = getattr(cfg.resources, stage)
        assert pool.gpu_replicas == "auto" and pool.replicas == "auto", f"{stage}: auto pools"
        assert pool.min_gpu_replicas == gpu["minReplicas"] * per_worker, stage
        assert pool.max_gpu_replicas == gpu["maxReplicas"] * per_worker, stage
        assert pool.min_replicas >= 1 and pool.max_replicas >= pool.min_replicas, stage
        assert at_max[(stage, GPU_POOL)].replicas == pool.max_gpu_replicas, (
            f"{kind} at maxReplicas cannot place {stage}'s max_gpu_replicas"
        )
        assert at_max[(stage, CPU_POOL)].replicas == pool.max_replicas, (
            f"{kind} at maxReplicas holds {at_max[(stage, CPU_POOL)].replicas} {stage} CPU "
            f"replicas, not max_replicas = {pool.max_replicas}"
        )
        held = cpu_workers_hold[(stage, CPU_POOL)].replicas
        assert pool.max_replicas == held, (
            f"{stage}: max_replicas {pool.max_replicas}, but the CPU group at maxReplicas "
            f"holds {held} of its CPU replicas"
        )
        asks_for_more |= at_min[(stage, GPU_POOL)].replicas < pool.max_gpu_replicas
        asks_for_more |= at_min[(stage, CPU_POOL)].replicas < pool.max_replicas
    # Pending replicas are demand only where an autoscaler reads it.
    assert asks_for_more and spec.get("enableInTreeAutoscaling") is True, (
        f"{kind}: the pools ask for more than the minimum size, so the cluster must autoscale"
    )


def test_configmap_is_infra_config_verbatim() -> None:
    data = _configmaps()["docintel-config"]
    for name in ("job.toml", "audit.toml"):
        assert data[name] == (CONFIG_DIR / name).read_text(encoding="utf-8"), (
            f"infra/kuberay/configmap.yaml {name} differs from infra/config/{name}: "
            "regenerate it (infra/README.md)"
        )


def test_rayjob_runs_the_batch_job_and_cleans_up() -> None:
    job = _one("RayJob")["spec"]
    assert job["entrypoint"] == f"python -m docintel.jobs.batch --config {CONFIG_MOUNT}/job.toml"
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
    assert f"python -m docintel.jobs.nightly_audit --config {CONFIG_MOUNT}/audit.toml" in command
    assert "audit.toml" in _mounted_config(head), "the driver runs on the head pod"


def test_no_credentials_or_runtime_installs_in_any_manifest() -> None:
    for path in YAML_FILES:
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"AKIA[0-9A-Z]{16}", text), f"{_rel(path)}: an AWS key id"
        for doc in _docs(path):
            assert doc.get("kind") != "Secret", f"{_rel(path)}: Secrets are created, not kept"
            for key, value in _walk(doc):
                if key == "env" and isinstance(value, list):  # items inherit the key too
                    for e in value:
                        if re.search(r"SECRET|TOKEN|PASSWORD|ACCESS_KEY", e["name"]):
                            assert "value" not in e, f"{_rel(path)}: literal {e['name']}"
                if key == "runtimeEnvYAML":
                    assert "pip" not in value, f"{_rel(path)}: pip at run time"
        for command in _yaml_commands(path):
            assert "pip install" not in command, f"{_rel(path)}: installs at run time"


# --- KubeRay: security -----------------------------------------------------------------


@dataclass
class Pod:
    """A pod template of the manifests, with the labels its pods will carry."""

    where: str  # e.g. "RayCluster gpu", "RayJob submitter"
    spec: dict[str, Any]  # the PodSpec
    labels: dict[str, str]
    role: str  # "head", "worker" or "submitter"
    cluster: str = ""  # the docintel/ray-cluster label of a Ray pod


def _ray_pods() -> list[Pod]:
    """Heads and workers of the RayCluster and of the RayJob's cluster. KubeRay adds
    ray.io/node-type to the template's labels; the NetworkPolicies select on it."""
    pods = []
    for kind, spec in _cluster_specs():
        groups = [("head", "head", spec["headGroupSpec"])]
        groups += [("worker", g["groupName"], g) for g in spec["workerGroupSpecs"]]
        for role, name, group in groups:
            labels = dict(group["template"].get("metadata", {}).get("labels", {}))
            cluster = labels.get(RAY_CLUSTER_LABEL, "")
            labels["ray.io/node-type"] = role
            pods.append(Pod(f"{kind} {name}", group["template"]["spec"], labels, role, cluster))
    return pods


def _submitter_pods() -> list[Pod]:
    """The pods that only call the Jobs API: the CronJob's and the RayJob's submitter."""
    cron = _one("CronJob")["spec"]["jobTemplate"]["spec"]["template"]
    rayjob = _one("RayJob")["spec"]
    assert "submitterPodTemplate" in rayjob, "the RayJob's submitter pod must be configured"
    return [
        Pod(where, t["spec"], dict(t.get("metadata", {}).get("labels", {})), "submitter")
        for where, t in [("CronJob", cron), ("RayJob submitter", rayjob["submitterPodTemplate"])]
    ]


def _containers(pod: Pod) -> list[dict[str, Any]]:
    return [*pod.spec.get("initContainers", []), *pod.spec["containers"]]


def _every_pod_spec() -> Iterator[tuple[str, dict[str, Any]]]:
    """Every PodSpec anywhere under infra/kuberay, whatever object holds it."""
    for obj in _kube_objects():
        for _, node in _walk(obj):
            if isinstance(node, dict) and isinstance(node.get("containers"), list):
                yield f"{obj['kind']} {obj['metadata']['name']}", node


def _autoscalers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(cluster, autoscalerOptions, head PodSpec) of every autoscaling cluster: KubeRay
    builds the sidecar container of the head pod from the options."""
    out = [
        (kind, spec["autoscalerOptions"], spec["headGroupSpec"]["template"]["spec"])
        for kind, spec in _cluster_specs()
        if spec.get("enableInTreeAutoscaling")
    ]
    assert {kind for kind, _, _ in out} == {"RayCluster", "RayJob"}, "both clusters autoscale"
    return out


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        present = key in labels
        if (
            (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
            or (op == "In" and labels.get(key) not in values)
            or (op == "NotIn" and labels.get(key) in values)
        ):
            return False
    return True


def _policies() -> list[dict[str, Any]]:
    return [d for d in _kube_objects() if d["kind"] == "NetworkPolicy"]


def _service_accounts() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _kube_objects() if d["kind"] == "ServiceAccount"}


def test_both_clusters_use_ray_token_auth_from_the_shared_secret() -> None:
    """authOptions: KubeRay's operator then authenticates its own Jobs API calls (a
    RayJob's status) and adds the token to the containers it injects."""
    for kind, spec in _cluster_specs():
        auth = spec.get("authOptions", {})
        assert auth.get("mode") == "token", f"{kind}: authOptions.mode must be token"
        assert auth.get("secretName") == TOKEN_SECRET, f"{kind}: the shared token Secret"


def test_every_ray_container_and_submitter_runs_with_the_token_from_a_secret() -> None:
    targets = [(f"{p.where} {c['name']}", c) for p in _ray_pods() for c in _containers(p)]
    targets += [(f"{p.where} {c['name']}", c) for p in _submitter_pods() for c in _containers(p)]
    targets += [(f"{kind} autoscaler", options) for kind, options, _ in _autoscalers()]
    for where, container in targets:
        env = _env(container)
        assert env.get("RAY_AUTH_MODE", {}).get("value") == "token", f"{where}: RAY_AUTH_MODE"
        token = env.get("RAY_AUTH_TOKEN")
        assert token, f"{where}: no RAY_AUTH_TOKEN"
        assert "value" not in token, f"{where}: RAY_AUTH_TOKEN must never be a literal"
        ref = token.get("valueFrom", {}).get("secretKeyRef")
        assert ref == {"name": TOKEN_SECRET, "key": TOKEN_KEY}, f"{where}: {token}"


def test_no_ray_token_or_key_is_ever_a_literal_anywhere() -> None:
    for path in YAML_FILES:
        for doc in _docs(path):
            for key, value in _walk(doc):
                if key != "env" or not isinstance(value, list):
                    continue
                for e in value:
                    if e["name"] in {"RAY_AUTH_TOKEN", "AWS_SECRET_ACCESS_KEY"}:
                        assert "secretKeyRef" in e.get("valueFrom", {}), f"{_rel(path)}: {e}"


def test_every_container_runs_as_non_root_with_a_restrictive_security_context() -> None:
    containers = [
        (f"{where} {c['name']}", c, spec)
        for where, spec in _every_pod_spec()
        for c in [*spec.get("initContainers", []), *spec["containers"]]
    ]
    containers += [(f"{kind} autoscaler", opts, head) for kind, opts, head in _autoscalers()]
    assert len(containers) >= 10, "heads, workers, submitters and the autoscalers"
    for where, c, pod in containers:
        sc = c.get("securityContext", {})
        assert sc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
        assert sc.get("runAsUser") == RAY_USER, f"{where}: runAsUser {RAY_USER} (ray)"
        assert sc.get("allowPrivilegeEscalation") is False, f"{where}: allowPrivilegeEscalation"
        assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{where}: drop ALL"
        assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: seccomp"
        assert "privileged" not in sc or sc["privileged"] is False, f"{where}: privileged"
        assert not sc.get("capabilities", {}).get("add"), f"{where}: added capabilities"
        # Read-only root everywhere, Ray's containers included: /tmp is the writable
        # scratch (an emptyDir of the pod), where Ray and the images' caches write.
        assert sc.get("readOnlyRootFilesystem") is True, f"{where}: readOnlyRootFilesystem"
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        tmp = [m for m in c.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
        assert tmp, f"{where}: a read-only root needs a writable /tmp"
        assert "emptyDir" in volumes[tmp[0]["name"]], f"{where}: /tmp is an emptyDir"
    for where, spec in _every_pod_spec():
        psc = spec.get("securityContext", {})
        assert psc.get("runAsNonRoot") is True and psc.get("runAsUser") == RAY_USER, where
        assert psc.get("seccompProfile", {}).get("type") == "RuntimeDefault", where
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), where


def test_network_policies_admit_only_the_cluster_itself_and_submitters_on_8265() -> None:
    policies = _policies()
    assert policies, f"no NetworkPolicy in {_rel(NETWORK_POLICIES)}"
    ray, submitters = _ray_pods(), _submitter_pods()
    clusters = {p.cluster for p in ray}
    assert all(clusters) and len(clusters) == 2, f"{RAY_CLUSTER_LABEL} on every Ray pod"
    for s in submitters:
        assert s.labels.get(SUBMITTER_LABEL) == "true", f"{s.where}: {SUBMITTER_LABEL} label"
    operator = {"app.kubernetes.io/name": "kuberay-operator"}
    for pod in ray:
        selecting = [np for np in policies if _selects(np["spec"]["podSelector"], pod.labels)]
        # Selected by an Ingress policy = isolated: only what some rule allows gets in.
        assert any("Ingress" in np["spec"].get("policyTypes", []) for np in selecting), (
            f"{pod.where}: no NetworkPolicy isolates it"
        )
        reachable: dict[str, set[int | None]] = {}  # peer -> ports (None: every TCP port)
        for np in selecting:
            name = np["metadata"]["name"]
            for rule in np["spec"].get("ingress", []):
                peers = rule.get("from")
                assert peers, f"{name}: a rule without `from` admits every source"
                ports = rule.get("ports")
                assert ports, f"{name}: a rule without `ports` admits every protocol"
                assert all(p.get("protocol", "TCP") == "TCP" for p in ports), name
                numbers = {p.get("port") for p in ports}
                for peer in peers:
                    assert "ipBlock" not in peer, f"{name}: no address ranges"
                    if "namespaceSelector" in peer:  # only the operator, from its namespace
                        assert peer.get("podSelector", {}).get("matchLabels") == operator, name
                        pinned = {"matchLabels": {NAMESPACE_LABEL: _operator_namespace()}}
                        assert peer["namespaceSelector"] == pinned, f"{name}: any namespace"
                        assert numbers == {DASHBOARD_PORT} and pod.role == "head", name
                        reachable.setdefault("operator", set()).update(numbers)
                        continue
                    sel = peer["podSelector"]
                    assert sel, f"{name}: an empty podSelector admits every pod"
                    for other in ray:
                        if _selects(sel, other.labels):
                            assert other.cluster == pod.cluster, (
                                f"{name}: {other.where} may reach {pod.where}"
                            )
                            reachable.setdefault(other.where, set()).update(numbers)
                    for s in submitters:
                        if _selects(sel, s.labels):
                            assert numbers == {DASHBOARD_PORT}, f"{name}: submitters get 8265 only"
                            assert pod.role == "head", f"{name}: submitters reach heads only"
                            reachable.setdefault(s.where, set()).update(numbers)
                    assert any(_selects(sel, p.labels) for p in [*ray, *submitters]), (
                        f"{name}: a peer that selects none of docintel's pods"
                    )
        # Ray's GCS (6379), client (10001), dashboard and node ports within the cluster.
        same = [p.where for p in ray if p.cluster == pod.cluster]
        assert all(reachable.get(w) == {None} for w in same), f"{pod.where}: {reachable}"
        if pod.role == "head":
            assert reachable.get("operator") == {DASHBOARD_PORT}, f"{pod.where}: the operator"
            assert all(reachable.get(s.where) == {DASHBOARD_PORT} for s in submitters), pod.where
        else:
            assert not any(s.where in reachable for s in submitters), pod.where


def _operator_namespace() -> str:
    """The namespace infra/README.md installs the KubeRay operator in."""
    command = r"helm install kuberay-operator (?:[^\n]|\\\n)*?--namespace (\S+)"  # one command
    found = re.search(command, README.read_text())
    assert found, f"{_rel(README)}: install the operator with --namespace"
    return found.group(1)


def test_the_operator_is_admitted_from_its_own_namespace_only() -> None:
    """A pod label alone can be worn by any pod in any namespace: `namespaceSelector: {}`
    plus the operator's label admitted them all. Kubernetes sets the namespace's
    kubernetes.io/metadata.name itself; the rule pins it to the operator's namespace."""
    peers = [
        (np["metadata"]["name"], peer)
        for np in _policies()
        for rule in np["spec"].get("ingress", [])
        for peer in rule.get("from", [])
        if "namespaceSelector" in peer
    ]
    assert peers, "no rule admits the KubeRay operator"
    namespace = _operator_namespace()
    assert namespace not in {"default", "kube-system"}, "the operator in a namespace of its own"
    for name, peer in peers:
        selector = peer["namespaceSelector"]
        assert selector == {"matchLabels": {NAMESPACE_LABEL: namespace}}, (name, selector)
        assert peer["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kuberay-operator"}


def _token_volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pod's volumes that carry a ServiceAccount token."""
    return {
        v["name"]: v
        for v in pod.get("volumes", [])
        if any("serviceAccountToken" in src for src in v.get("projected", {}).get("sources", []))
    }


def test_only_the_autoscaler_container_holds_a_kubernetes_api_token() -> None:
    """Job drivers run in the head's Ray container: an API token there gives whoever holds
    the Ray token the autoscaler's right to create pods. The head pod mounts no token; a
    projected one goes into the autoscaler sidecar alone, where KubeRay's autoscaler
    reads it (the standard path: token, ca.crt, namespace)."""
    for kind, options, head in _autoscalers():
        assert head.get("automountServiceAccountToken") is False, f"{kind} head: pod-wide token"
        assert not head.get("shareProcessNamespace"), f"{kind}: the sidecar's files stay its own"
        mounts = [m for m in options.get("volumeMounts", []) if m["mountPath"] == API_TOKEN_PATH]
        assert len(mounts) == 1 and mounts[0].get("readOnly") is True, f"{kind} autoscaler"
        volume = _token_volumes(head).get(mounts[0]["name"])
        assert volume, f"{kind}: the autoscaler's token must be a projected token volume"
        sources = volume["projected"]["sources"]
        (token,) = [src["serviceAccountToken"] for src in sources if "serviceAccountToken" in src]
        assert token["path"] == "token" and token.get("expirationSeconds", 3600) <= 3607, token
        assert "audience" not in token, "the API server's own audience"
        files = {
            item["path"] for src in sources for item in next(iter(src.values())).get("items", [])
        }
        assert {"ca.crt", "namespace"} <= files, (
            f"{kind}: the autoscaler needs the CA and namespace"
        )
    for pod in _ray_pods():
        tokens = _token_volumes(pod.spec)
        for c in _containers(pod):
            for m in c.get("volumeMounts", []):
                assert m["name"] not in tokens, f"{pod.where} {c['name']}: mounts {m['name']}"
                assert not m["mountPath"].startswith("/var/run/secrets/kubernetes.io"), pod.where
            assert "KUBECONFIG" not in _env(c), f"{pod.where} {c['name']}: a kubeconfig"


def test_head_services_stay_inside_the_cluster() -> None:
    for kind, spec in _cluster_specs():
        head = spec["headGroupSpec"]
        assert head.get("serviceType", "ClusterIP") == "ClusterIP", f"{kind}: ClusterIP only"
        svc = head.get("headService", {}).get("spec", {})
        assert svc.get("type", "ClusterIP") == "ClusterIP", f"{kind}: headService type"
        assert not head.get("enableIngress"), f"{kind}: no Ingress for the dashboard"
        # KubeRay's default (all interfaces of the pod) is what the head service, the
        # submitters and the operator need; nothing may widen it further.
        assert head["rayStartParams"].get("dashboard-host", "0.0.0.0") == "0.0.0.0", kind
    for obj in _kube_objects():
        assert obj["kind"] not in {"Service", "Ingress", "Route"}, f"{obj['kind']} exposes Ray"
        for key, value in _walk(obj):
            if key in {"type", "serviceType"} and isinstance(value, str):
                assert value not in {"LoadBalancer", "NodePort"}, f"{obj['kind']}: {value}"


def test_ray_pods_use_workload_identity_and_submitters_no_cloud_identity() -> None:
    accounts = _service_accounts()
    roles = {
        name: sa["metadata"].get("annotations", {}).get(IRSA_ANNOTATION)
        for name, sa in accounts.items()
    }
    with_role = [name for name, role in roles.items() if role]
    assert len(with_role) == 1, f"one ServiceAccount with an IAM role in {_rel(SERVICE_ACCOUNTS)}"
    (ray_sa,) = with_role
    assert re.fullmatch(r"arn:aws:iam::(?:\d{12}|ACCOUNT_ID):role/docintel-s3", roles[ray_sa])
    for pod in _ray_pods():
        assert pod.spec.get("serviceAccountName") == ray_sa, f"{pod.where}: {ray_sa}"
        # No pod-wide API token, heads included: only their autoscaler sidecar mounts one
        # (test_only_the_autoscaler_container_holds_a_kubernetes_api_token).
        assert pod.spec.get("automountServiceAccountToken") is False, pod.where
        for c in _containers(pod):
            # IRSA is the default: no static keys loaded (the fallback is commented out).
            assert not c.get("envFrom"), f"{pod.where} {c['name']}: static AWS keys"
            assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & _env(c).keys()
    for pod in _submitter_pods():
        sa = pod.spec.get("serviceAccountName")
        assert sa in accounts and not roles[sa], f"{pod.where}: a ServiceAccount without role"
        assert pod.spec.get("automountServiceAccountToken") is False, f"{pod.where}: API token"
        for c in _containers(pod):
            assert not c.get("envFrom"), f"{pod.where} {c['name']}: no envFrom in a submitter"
            aws = [n for n in _env(c) if n.startswith("AWS_")]
            assert not aws, f"{pod.where} {c['name']}: AWS credentials in a submitter: {aws}"


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

    from docintel.jobs.cli import app

    return set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def test_cron_validator_rejects_bad_schedules() -> None:
    for good in ["0 2 * * *", "*/15 * * * *", "0 2 * * mon-fri", "30 4 1,15 jan-jun 0"]:
        assert cron_is_valid(good), good
    for bad in ["0 2 * *", "60 2 * * *", "0 24 * * *", "0 2 0 * *", "0 2 * * mon-xyz", "@daily"]:
        assert not cron_is_valid(bad), bad


def test_every_python_module_named_exists() -> None:
    named = {(f, m) for f, c in _all_commands() for m in PYTHON_M.findall(c)}
    modules = {m for _, m in named}
    assert {"docintel.jobs.batch", "docintel.jobs.nightly_audit"} <= modules, modules
    missing = sorted(f"{m} (in {f})" for f, m in named if importlib.util.find_spec(m) is None)
    assert not missing, f"`python -m` names modules that do not exist: {missing}"


def test_every_docintel_subcommand_named_is_registered() -> None:
    named = {(f, s) for f, c in _all_commands() for s in DOCINTEL_SUB.findall(c)}
    subs = {s for _, s in named}
    assert {"audit", "quantize", "submit"} <= subs, subs
    registered = _registered_commands()
    missing = sorted(f"docintel {s} (in {f})" for f, s in named if s not in registered)
    assert not missing, f"not registered on docintel.jobs.cli.app ({sorted(registered)}): {missing}"


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


@pytest.mark.parametrize(("kind", "name"), CLUSTER_CONFIGS)
def test_cluster_configs_join_the_cluster_with_a_gpu_and_spill_layout(kind: str, name: str) -> None:
    cfg = _cluster_config(name)
    assert cfg.run.ray_address == "auto", "a job on a cluster must join it, not embed Ray"
    job, audit = cfg.job, cfg.audit
    uris = [job.input, job.output] if name == "job.toml" else [audit.source, audit.output]
    assert all(u.startswith("s3://") for u in uris), uris
    r = cfg.resources
    defaults = {
        s: Config().resources.pool(s).gpu_fraction for s in ("sentencize", "embed", "classify")
    }
    for stage, fraction in defaults.items():
        pool = getattr(r, stage)
        assert pool.gpu_replicas == "auto" and pool.replicas == "auto", f"{stage}: auto pools"
        assert pool.gpu_fraction == fraction, f"{stage}: the default fraction"
    assert sum(defaults.values()) <= 1.0
    assert cfg.run.spill == "auto" and cfg.embed.cpu_precision == "auto"  # int8 spill replicas
    # At the minimum size every stage has a GPU pool and a CPU spill pool; the spill
    # replicas of the model stages run the int8 models built into the image.
    pools = _pools(stage_layout(cfg, _min_shape(dict(_cluster_specs())[kind])))
    for stage in STAGES:
        assert pools.get((stage, GPU_POOL)) and pools[(stage, GPU_POOL)].replicas >= 1, stage
        spill = pools.get((stage, CPU_POOL))
        assert spill and spill.replicas >= 1, f"{stage}: no spill pool at the minimum size"
        assert spill.precision == ("int8" if stage in INT8_STAGES else "fp32"), stage
    # One thread per CPU an embed CPU replica holds: no oversubscription, no idle CPU.
    assert cfg.embed.torch_threads == r.embed.cpus, "embed torch_threads = its replicas' cpus"


def test_local_audit_config_embeds_ray() -> None:
    cfg = _cluster_config("audit-local.toml")
    assert cfg.run.ray_address == "", "the single-machine audit starts its own Ray"
    assert cfg.audit.source and cfg.audit.output
    shape = ClusterShape.of(2.0)  # the default pools fit a two-core machine
    check_layout(cfg, stage_layout(cfg, shape), shape)


# --- the Ray cluster launcher ----------------------------------------------------------


def test_launcher_config_is_valid_for_ray_and_fits_the_layout() -> None:
    config = yaml.safe_load(LAUNCHER.read_text(encoding="utf-8"))
    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    jsonschema.validate(config, json.loads(schema_path.read_text(encoding="utf-8")))

    assert _tag_part(config["docker"]["image"]) == _image_for("cpu")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"]["CPU"] == 0
    assert any("--head" in c and "--num-cpus=0" in c for c in config["head_start_ray_commands"])
    workers = {k: v for k, v in types.items() if k != config["head_node_type"]}
    gpu = [v for v in workers.values() if v["resources"].get("GPU", 0) > 0]
    assert len(gpu) == 1 and gpu[0]["resources"]["GPU"] == 1
    assert _tag_part(gpu[0]["docker"]["worker_image"]) == _image_for("cuda")
    for node in workers.values():
        if node not in gpu:
            image = node.get("docker", {}).get("worker_image", _image_for("cpu"))
            assert _tag_part(image) == _image_for("cpu")
    assert sum(v["max_workers"] for v in workers.values()) <= config["max_workers"]

    local = config["file_mounts"][CONFIG_MOUNT]
    assert (REPO / local).resolve() == CONFIG_DIR, "infra/config at /etc/docintel"
    # The same pools as on KubeRay: the minimum size fits their min_*, refused without
    # the GPU worker; the maximum size holds their max_* (one GPU replica per stage per
    # GPU worker).
    low, high = _launcher_shape(config, "min_workers"), _launcher_shape(config, "max_workers")
    (gpu_type,) = gpu
    for name in ("job.toml", "audit.toml"):
        cfg = _cluster_config(name)
        _fits(cfg, low)
        with pytest.raises(ConfigError, match="GPU replicas need"):
            _fits(cfg, _without_gpus(low))
        at_max = _pools(_fits(cfg, high))
        for stage in STAGES:
            pool = getattr(cfg.resources, stage)
            assert pool.min_gpu_replicas == gpu_type["min_workers"], (name, stage)
            assert pool.max_gpu_replicas == gpu_type["max_workers"], (name, stage)
            assert at_max[(stage, GPU_POOL)].replicas == pool.max_gpu_replicas, (name, stage)
            assert at_max[(stage, CPU_POOL)].replicas == pool.max_replicas, (name, stage)


def test_launcher_pins_its_ami_and_starts_ray_with_token_auth() -> None:
    config = yaml.safe_load(LAUNCHER.read_text(encoding="utf-8"))
    for name, node in config["available_node_types"].items():
        ami = node["node_config"]["ImageId"]
        assert re.fullmatch(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})", ami), (
            f"{name}: ImageId {ami!r} must be an explicit AMI id, not an alias"
        )
    starts = [
        c
        for key in ("head_start_ray_commands", "worker_start_ray_commands")
        for c in config[key]
        if "ray start" in c
    ]
    assert len(starts) == 2, starts
    paths = set()
    for command in starts:
        assert re.search(r"\bRAY_AUTH_MODE=token\b", command), f"no token auth: {command}"
        m = re.search(r"\bRAY_AUTH_TOKEN_PATH=(/\S+?);?(?:\s|$)", command)
        assert m, f"the token must come from a file: {command}"
        paths.add(m.group(1))
        assert "RAY_AUTH_TOKEN=" not in command, "never the token itself on a command line"
        assert "0.0.0.0" not in command, f"nothing listens on all interfaces: {command}"
    (token,) = paths
    (head,) = [c for c in starts if "--head" in c]
    assert "--dashboard-host=127.0.0.1" in head, "the dashboard on the head's loopback only"
    # The file reaches every node from a folder of the workstation, mode 0600, checked.
    folder = str(Path(token).parent)
    assert folder in config["file_mounts"], f"{folder} is not in file_mounts"
    local = config["file_mounts"][folder]
    assert local.startswith("~/"), (
        f"{local}: a private folder of the workstation's home, never of the repository"
    )
    assert any(f"chmod 0600 {token}" in c for c in config["setup_commands"]), "mode 0600"
    # Every process in the containers (`ray exec`, the autoscaler) gets the same setting.
    options = config["docker"]["run_options"]
    assert "--env RAY_AUTH_MODE=token" in options
    assert f"--env RAY_AUTH_TOKEN_PATH={token}" in options


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
        f"kubectl create secret generic {TOKEN_SECRET} --from-file={TOKEN_KEY}=",
        "kubectl create secret generic docintel-aws --from-env-file=",
        "kubectl apply -f infra/kuberay/serviceaccounts.yaml -f infra/kuberay/networkpolicy.yaml",
        "kubectl apply -f infra/kuberay/raycluster.yaml",
        "kubectl apply -f infra/kuberay/rayjob.yaml",
        "kubectl apply -f infra/kuberay/cronjob-audit.yaml",
        "ray up -y infra/ray-cluster-launcher.yaml",
        "systemctl enable --now docintel-audit.timer",
        "crontab -u docintel infra/crontab.example",
    ]:
        assert step in text, f"README lacks: {step}"


# Secret values typed where a process list, shell history or a manifest would keep them.
SECRET_ON_A_COMMAND_LINE = [
    re.compile(r"--from-literal=[\w.-]*(?:SECRET|TOKEN|PASSWORD|ACCESS_KEY|KEY_ID)", re.I),
    re.compile(r"\b(?:AWS_SECRET_ACCESS_KEY|AWS_ACCESS_KEY_ID|AWS_SESSION_TOKEN)=\S"),
    re.compile(r"\bRAY_AUTH_TOKEN=\S"),
    re.compile(r"\bray job submit\b.*--headers\b.*[Aa]uthorization"),
]


def _secret_on_a_command_line(text: str) -> list[str]:
    return [m.group(0) for rx in SECRET_ON_A_COMMAND_LINE for m in rx.finditer(text)]


def test_secret_detector_flags_typed_secrets() -> None:
    for bad in [
        'kubectl create secret generic docintel-aws --from-literal=AWS_SECRET_ACCESS_KEY="$K"',
        "kubectl create secret generic x --from-literal=auth_token=abc",
        "AWS_ACCESS_KEY_ID=AKIA0000 docintel run",
        "export RAY_AUTH_TOKEN=$(cat token)",
    ]:
        assert _secret_on_a_command_line(bad), bad
    for good in [
        "kubectl create secret generic docintel-ray-auth --from-file=auth_token=ray-auth-token",
        "kubectl create secret generic docintel-aws --from-env-file=docintel-aws.env",
        'export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$HOME/.ray/docintel-auth/auth_token"',
        "- name: RAY_AUTH_TOKEN",
    ]:
        assert not _secret_on_a_command_line(good), good


def test_no_secret_is_ever_typed_in_the_guide_or_the_deploy_files() -> None:
    files = [README, *YAML_FILES, CRONTAB, *SYSTEMD.glob("*"), *INFRA.glob("Dockerfile.*")]
    for path in files:
        found = _secret_on_a_command_line(path.read_text(encoding="utf-8"))
        assert not found, f"{_rel(path)} puts a secret on a command line: {found}"
    text = README.read_text(encoding="utf-8")
    # ... and the guide says how to do it instead: from a private file, then deleted.
    assert f"--from-file={TOKEN_KEY}=ray-auth-token" in text
    assert "umask 077" in text and "rm -f ray-auth-token" in text
    assert "--from-env-file=docintel-aws.env" in text and "rm -f docintel-aws.env" in text


def test_images_are_pinned_by_digest_or_the_guide_documents_the_pin() -> None:
    """Our images are built by the user, so their digest cannot be shipped: the manifests
    carry the documented tag, and infra/README.md the procedure that pins it by digest
    (which the image test above accepts). A digest, where present, must be well formed."""
    images = [
        value
        for path in YAML_FILES
        for doc in _docs(path)
        for key, value in _walk(doc)
        if key in IMAGE_KEYS and isinstance(value, str)
    ]
    text = README.read_text(encoding="utf-8")
    procedure = ("crane digest" in text or "imagetools inspect" in text) and all(
        f"({_image_for(f).rsplit('/', 1)[-1]})(@sha256:[0-9a-f]{{64}})?$|\\1@" in text
        for f in FLAVORS
    )
    for image in images:
        if "@" in image:
            assert DIGEST.search(image), f"malformed digest pin: {image}"
        else:
            assert procedure, f"{image} is not pinned and infra/README.md lacks the procedure"
    assert f"image: {_image_for('cpu')}@sha256:<digest>" in text


@pytest.mark.parametrize("flavor", FLAVORS)
def test_dockerfile_base_image_can_be_pinned_by_digest(flavor: str) -> None:
    """The base is pinnable with --build-arg RAY_BASE_DIGEST=@sha256:<digest>; no digest is
    shipped (one nobody read from the registry would break every build), so the
    procedure must be documented where the build commands are."""
    df = DOCKERFILES[flavor]
    from_line = df.all("FROM")[0].split()[0]
    assert from_line.endswith("${RAY_BASE_DIGEST}"), from_line
    args_before_from = df.instructions[: df.instructions.index(("FROM", df.all("FROM")[0]))]
    assert ("ARG", "RAY_BASE_DIGEST=") in args_before_from or DIGEST.fullmatch(
        df.args.get("RAY_BASE_DIGEST", "")
    ), "RAY_BASE_DIGEST: empty or @sha256:<64 hex>, declared before FROM"
    documented = " ".join(df.comments)
    assert "--build-arg RAY_BASE_DIGEST=@sha256:" in documented
    assert "imagetools inspect rayproject/ray:" in documented
    assert "--build-arg RAY_BASE_DIGEST=@sha256:" in README.read_text(encoding="utf-8")
    # Non-root by number, so Kubernetes can verify runAsNonRoot from the image too.
    assert df.all("USER")[-1] == f"{RAY_USER}:100"


# --- metrics and the Grafana dashboard -------------------------------------------------


def _defined_metrics() -> dict[str, str]:
    """{name given to ray.util.metrics: its kind} for every metric actors/metrics.py
    defines, read from its source (``metrics.Counter(PREFIX + "batches", ...)``)."""
    tree = ast.parse(METRICS_MODULE.read_text(encoding="utf-8"))
    consts = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and isinstance(node.value, ast.Constant)
    }

    def text(node: ast.expr) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return str(consts[node.id])
        assert isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add), ast.dump(node)
        return text(node.left) + text(node.right)

    found = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "metrics"
            and node.func.attr in {"Counter", "Gauge", "Histogram"}
        ):
            found[text(node.args[0])] = node.func.attr
    assert found, f"no ray.util.metrics metric found in {_rel(METRICS_MODULE)}"
    return found


def _exported_names() -> dict[str, str]:
    """{Prometheus name: name in the code}, as a Ray node's metrics endpoint serves them:
    Ray prefixes every metric with ``ray_``; counters carry the ``_total`` suffix of the
    Prometheus exposition (Ray 2.60's OpenTelemetry exporter, and the OpenCensus one),
    histograms their ``_bucket`` / ``_sum`` / ``_count`` series."""
    suffixes = {"Counter": ["_total"], "Gauge": [""], "Histogram": ["_bucket", "_sum", "_count"]}
    return {
        f"ray_{name}{suffix}": name
        for name, kind in _defined_metrics().items()
        for suffix in suffixes[kind]
    }


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def _dashboard_panels() -> list[dict[str, Any]]:
    """Every chart of the dashboard, those inside collapsed rows too (rows are headings)."""
    out = []
    for panel in _dashboard()["panels"]:
        inner = panel.get("panels", []) if panel.get("type") == "row" else [panel]
        out += [p for p in inner if p.get("type") != "row"]
    return out


DOCINTEL_METRIC = re.compile(r"\bray_docintel_\w+")


def test_metric_names_follow_how_ray_exports_them() -> None:
    """The naming rule of _exported_names, checked on the libraries Ray's metrics agent
    exports with: its OpenTelemetry recorder makes every ray.util.metrics Counter an
    observable counter and every Gauge an observable gauge named ``<NAMESPACE>_<name>``
    with unit "1"; the Prometheus reader and prometheus_client write them out."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import CollectorRegistry, generate_latest
    from ray._private.telemetry.open_telemetry_metric_recorder import NAMESPACE

    assert NAMESPACE == "ray", "Ray's prefix for application metrics"

    def one(_: CallbackOptions) -> list[Observation]:
        return [Observation(1.0, {"run": "r"})]

    registry = CollectorRegistry()
    reader = PrometheusMetricReader(registry=registry)
    provider = MeterProvider(metric_readers=[reader])
    try:
        meter = provider.get_meter("docintel-test")
        meter.create_observable_counter(f"{NAMESPACE}_docintel_c", [one], unit="1")
        meter.create_observable_gauge(f"{NAMESPACE}_docintel_g", [one], unit="1")
        text = generate_latest(registry).decode()
    finally:
        provider.shutdown()
    samples = set(re.findall(r"^(ray_docintel_\w+)\{", text, re.M))
    assert samples == {"ray_docintel_c_total", "ray_docintel_g"}, text
    names = _exported_names()
    assert "ray_docintel_batches_total" in names and "ray_docintel_batches" not in names
    assert "ray_docintel_replicas" in names, sorted(names)  # a gauge: no suffix


def test_dashboard_charts_only_metrics_the_code_exports() -> None:
    dashboard = _dashboard()
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ds = {"type": "prometheus", "uid": "${datasource}"}
    exported = _exported_names()
    panels = _dashboard_panels()
    assert len(panels) >= 8, "throughput, spill, held, replicas, busy, failures, GPU memory"
    charted: set[str] = set()
    queries = [
        ("variable " + v["name"], v["definition"])
        for v in variables.values()
        if v["type"] == "query"
    ]
    for panel in panels:
        title = panel.get("title", "")
        assert title, f"panel {panel.get('id')} has no title"
        assert panel.get("datasource") == ds, f"{title}: datasource must be ${{datasource}}"
        targets = panel.get("targets", [])
        assert targets, f"{title}: an empty panel"
        for target in targets:
            expr = target.get("expr", "").strip()
            assert expr, f"{title}: a target without a query"
            assert target.get("datasource", ds) == ds, f"{title}: target datasource"
            queries.append((title, expr))
    for where, expr in queries:
        named = set(DOCINTEL_METRIC.findall(expr))
        assert named, f"{where}: {expr!r} names no docintel metric"
        unknown = named - exported.keys()
        assert not unknown, (
            f"{where}: {sorted(unknown)} is not what Ray exports for {_rel(METRICS_MODULE)} "
            f"(known: {sorted(exported)})"
        )
        charted |= {exported[n] for n in named}
    missing = sorted(set(_defined_metrics()) - charted)
    assert not missing, f"{_rel(DASHBOARD)} does not chart {missing}"
    stage = variables.get("stage")
    if stage and stage["type"] == "custom":
        assert stage["query"].split(",") == list(STAGES), "the stage variable lists STAGES"


def test_readme_names_every_exported_metric() -> None:
    text = README.read_text(encoding="utf-8")
    missing = [n for n in _exported_names() if f"`{n}`" not in text]
    assert not missing, f"infra/README.md does not list {missing}"
