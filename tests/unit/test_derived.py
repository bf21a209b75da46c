"""Derived artefacts in the cache: written whole with a checksum, checked before a run,
a damaged one rebuilt once (with a line saying so), builds serialised on the folder's lock.

The artefact here is a tiny ONNX graph built in a millisecond, standing in for the
registry's (the fp32 encoder's real rebuild runs end to end in
tests/integration/test_derived_run.py); the int8 encoder's own writer is checked with its
export and quantizer stubbed.
"""

from __future__ import annotations

import fcntl
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from docintel.jobs import cli_models
from docintel.pipeline import registry
from docintel.pipeline.artefacts import derived
from docintel.pipeline.artefacts.paths import (
    BUILD_LOCK,
    INT8_MODEL_FILE,
    RECIPE_FILE,
    TEMP_PREFIX,
    checksum_path,
    checksum_problem,
    file_sha256,
    install,
)
from docintel.pipeline.config import Config, EmbedConfig
from docintel.pipeline.errors import ModelError
from docintel.pipeline.offline import quantize
from docintel.pipeline.run.plan import ensure_derived

NAME = "model.fake.onnx"


def _tiny_onnx() -> bytes:
    """An ONNX graph that loads (Identity on a float vector)."""
    from onnx import TensorProto, helper

    value = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "tiny",
        [value("x", TensorProto.FLOAT, [2])],
        [value("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what every onnxruntime of the supported range reads
    return model.SerializeToString()


TINY = _tiny_onnx()


class Builds:
    """A stand-in artefact's builder, as quantize's are: staged in the folder, installed
    whole with its checksum; counts the builds and when each ran."""

    def __init__(self, path: Path, hold_s: float = 0.0) -> None:
        self.path, self.hold_s = path, hold_s
        self.spans: list[tuple[float, float]] = []
        self.corrupt_after = False  # a builder whose output fails its checksum

    def __call__(self) -> Path:
        t0 = time.monotonic()
        time.sleep(self.hold_s)
        with tempfile.TemporaryDirectory(prefix=TEMP_PREFIX, dir=self.path.parent) as tmp:
            staged = Path(tmp) / self.path.name
            staged.write_bytes(TINY)
            install(staged, self.path)
        if self.corrupt_after:
            self.path.write_bytes(TINY[:10])
        self.spans.append((t0, time.monotonic()))
        return self.path


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    return tmp_path / "int8"


@pytest.fixture
def cfg(folder: Path) -> Config:
    return Config().with_overrides({"embed.int8_dir": str(folder)})


@pytest.fixture
def builds(folder: Path, monkeypatch: pytest.MonkeyPatch) -> Builds:
    """The run's derived artefacts are one stand-in (built by ``builds``)."""
    b = Builds(folder / NAME)
    art = registry.Artefact("stand-in ONNX model", b.path, b)
    monkeypatch.setattr(derived, "derived_artefacts", lambda _cfg, _layouts: [art])
    return b


def test_an_artefact_is_installed_whole_with_its_checksum(
    cfg: Config, folder: Path, builds: Builds
) -> None:
    said: list[str] = []
    ensure_derived(cfg, said.append)
    assert len(builds.spans) == 1 and any("building the stand-in" in s for s in said), said
    recorded = checksum_path(builds.path).read_text()
    assert recorded == f"{file_sha256(builds.path)}  {NAME}\n"  # `sha256sum -c` reads it
    assert checksum_problem(builds.path) is None
    assert sorted(p.name for p in folder.iterdir()) == sorted([BUILD_LOCK, NAME, f"{NAME}.sha256"])
    again: list[str] = []
    ensure_derived(cfg, again.append)
    assert again == [] and len(builds.spans) == 1


@pytest.mark.parametrize("damage", ["truncated", "flipped", "checksum-lost-and-broken"])
def test_a_damaged_cached_artefact_is_rebuilt_once_with_a_message(
    cfg: Config, builds: Builds, damage: str
) -> None:
    ensure_derived(cfg, lambda _: None)
    data = builds.path.read_bytes()
    if damage == "truncated":
        builds.path.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        builds.path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    else:  # cached before checksums were kept, and broken: it does not load either
        checksum_path(builds.path).unlink()
        builds.path.write_bytes(b"not an onnx graph")
    said: list[str] = []
    ensure_derived(cfg, said.append)
    what = "does not load" if damage.startswith("checksum") else "does not match its checksum"
    (line,) = [s for s in said if "rebuilding" in s]
    assert f"the cached stand-in ONNX model {builds.path} {what}" in line, said
    assert len(builds.spans) == 2 and builds.path.read_bytes() == TINY
    again: list[str] = []
    ensure_derived(cfg, again.append)
    assert again == [] and len(builds.spans) == 2


def test_an_artefact_cached_before_checksums_were_kept_is_kept_if_it_loads(
    cfg: Config, builds: Builds
) -> None:
    ensure_derived(cfg, lambda _: None)
    checksum_path(builds.path).unlink()
    said: list[str] = []
    ensure_derived(cfg, said.append)
    assert said == [] and len(builds.spans) == 1  # loaded, so its checksum is recorded
    assert checksum_problem(builds.path) is None


def test_a_rebuild_that_still_fails_its_checksum_is_refused(cfg: Config, builds: Builds) -> None:
    builds.corrupt_after = True
    with pytest.raises(ModelError, match=r"rebuilt the stand-in ONNX model .* but it still"):
        ensure_derived(cfg, lambda _: None)
    assert len(builds.spans) == 1  # once, not in a loop


def test_what_a_killed_build_staged_is_never_picked_up(
    cfg: Config, folder: Path, builds: Builds
) -> None:
    """A build killed before its rename leaves only hidden staged files: the artefact is
    missing (built), and the leftovers are removed under the lock."""
    folder.mkdir(parents=True)
    (folder / f"{TEMP_PREFIX}dead0001").mkdir()
    (folder / f"{TEMP_PREFIX}dead0001" / NAME).write_bytes(TINY[:20])
    (folder / f"{TEMP_PREFIX}dead0002-{NAME}.tmp").write_bytes(TINY[:20])
    said: list[str] = []
    ensure_derived(cfg, said.append)
    assert not any("rebuilding" in s for s in said), said  # missing, not damaged
    assert len(builds.spans) == 1 and builds.path.read_bytes() == TINY
    assert not list(folder.glob(f"{TEMP_PREFIX}*"))


def test_the_int8_encoder_is_not_written_in_place(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quantizer that dies half-way through writing leaves no int8 encoder (nor
    checksum) a reader could load; a finished one lands whole, checksum after it."""
    import onnxruntime.quantization

    seen: dict[str, bool] = {}

    def export(_model_dir: Path, path: Path) -> None:
        path.write_bytes(TINY)

    def dies_half_way(_src: str, dst: str, **_kw: object) -> None:
        Path(dst).write_bytes(TINY[: len(TINY) // 2])
        seen["target_exists_while_writing"] = (folder / INT8_MODEL_FILE).exists()
        raise MemoryError("killed while writing")

    monkeypatch.setattr(quantize, "export_onnx", export)
    monkeypatch.setattr(quantize, "ffn_output_matmuls", lambda _raw: [f"ffn{i}" for i in range(6)])
    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", dies_half_way)
    encoder = EmbedConfig().resolved_model_path()
    with pytest.raises(MemoryError):
        quantize.build_int8(encoder, folder)
    assert seen == {"target_exists_while_writing": False}
    assert not (folder / INT8_MODEL_FILE).exists()
    assert not checksum_path(folder / INT8_MODEL_FILE).exists()
    assert not list(folder.glob(f"{TEMP_PREFIX}*"))  # the staging folder went with it

    def writes(_src: str, dst: str, **_kw: object) -> None:
        Path(dst).write_bytes(TINY)

    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", writes)
    quantize.build_int8(encoder, folder)
    assert (folder / INT8_MODEL_FILE).read_bytes() == TINY
    assert checksum_problem(folder / INT8_MODEL_FILE) is None
    assert json.loads((folder / RECIPE_FILE).read_text())["quantization"]["kept_fp32"]


def _in_thread(fn: Callable[[], object]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def test_quantize_and_a_runs_build_take_turns_on_the_build_lock(
    cfg: Config, folder: Path, builds: Builds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`docintel quantize` holds the lock a run's build on first need takes: while one
    builds, the other waits, then finds the work done or does its own."""
    spans: list[tuple[float, float]] = []
    started = threading.Event()

    def slow_build(*_args: object) -> Path:
        t0 = time.monotonic()
        started.set()
        time.sleep(0.5)
        spans.append((t0, time.monotonic()))
        return folder / "x.onnx"

    for name in ("build_fp32", "build_int8", "build_fp32_classifier", "build_int8_classifier"):
        monkeypatch.setattr(quantize, name, slow_build)
    monkeypatch.setattr(cli_models, "DEFAULT_PARITY_DATA", folder / "no-such.csv")
    config = folder.parent / "docintel.toml"
    config.write_text(f'[embed]\nint8_dir = "{folder}"\n')
    cli = _in_thread(lambda: cli_models.quantize(config=config, out_dir=None, data=None))
    assert started.wait(60)
    ensure_derived(cfg, lambda _: None)  # the run's build waits for quantize's four
    cli.join(60)
    assert len(spans) == 4 and len(builds.spans) == 1
    assert builds.spans[0][0] >= max(end for _, end in spans), (spans, builds.spans)


def test_a_runs_build_waits_for_a_lock_held_elsewhere(
    cfg: Config, folder: Path, builds: Builds
) -> None:
    folder.mkdir(parents=True)
    with (folder / BUILD_LOCK).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process building this folder
        run = _in_thread(lambda: ensure_derived(cfg, lambda _: None))
        time.sleep(0.5)
        assert builds.spans == [] and run.is_alive()
    run.join(30)
    assert len(builds.spans) == 1


def test_a_read_only_cache_is_used_as_is_and_a_damaged_artefact_there_is_refused(
    cfg: Config, builds: Builds, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Artefacts shipped in an image (read-only root filesystem): no lock can be taken
    and nothing rebuilt; intact ones run, a damaged one is a ModelError naming it."""
    ensure_derived(cfg, lambda _: None)

    def read_only(folder: Path) -> None:
        raise OSError(30, "Read-only file system", str(folder / BUILD_LOCK))

    monkeypatch.setattr(derived, "build_lock", read_only)
    checksum_path(builds.path).unlink()  # built before checksums were kept: it loads
    ensure_derived(cfg, lambda _: None)
    builds.path.write_bytes(TINY[:10])
    with pytest.raises(ModelError, match=r"does not load, and it cannot be rebuilt here"):
        ensure_derived(cfg, lambda _: None)
    assert len(builds.spans) == 1
