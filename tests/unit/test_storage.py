"""docintel.pipeline.storage without a server: URIs to filesystems, S3 settings, error messages."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from docintel.pipeline.config import StorageConfig, load_config
from docintel.pipeline.errors import ConfigError, InputError, OutputError
from docintel.pipeline.storage import (
    ENDPOINT_ENVS,
    ConfiguredS3FileSystem,
    check_bucket,
    display_uri,
    effective_endpoint,
    resolve_uri,
    s3_error,
)

LOCAL = StorageConfig()
# endpoint and region set: building the filesystem then needs no network look-up
LOOPBACK = StorageConfig(s3_endpoint="http://127.0.0.1:9000", s3_region="eu-west-1", s3_attempts=4)
SECRET = "unit-test-secret-7f3a9c"

# pyarrow's own texts for failed S3 requests, as moto's server produced them
ACCESS_DENIED = (
    "When getting information for key 'corpus' in bucket 'in-bucket': AWS Error "
    "ACCESS_DENIED during HeadObject operation: No response body."
)
NO_SUCH_BUCKET = (
    "When listing objects under key 'corpus/' in bucket 'in-bucket': AWS Error "
    "NO_SUCH_BUCKET during ListObjectsV2 operation: The specified bucket does not exist"
)
NO_CONNECTION = (
    "When getting information for key 'x' in bucket 'in-bucket': AWS Error NETWORK_CONNECTION "
    "during HeadObject operation: curlCode: 7, Could not connect to server"
)


def _pyarrow_options(fs: pafs.S3FileSystem) -> dict:
    """The options pyarrow itself holds (its own pickling reports them)."""
    return pafs.S3FileSystem.__reduce__(fs)[1][0]


def test_local_path_becomes_absolute_and_resolved(tmp_path, monkeypatch):
    (tmp_path / "data" / "in").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "data")
    fs, path = resolve_uri("in/../in/", LOCAL)
    assert isinstance(fs, pafs.LocalFileSystem)
    assert path == str(tmp_path / "data" / "in")
    _, missing = resolve_uri("not/yet/there", LOCAL, "output")  # no I/O, no existence check
    assert missing == str(tmp_path / "data" / "not" / "yet" / "there")


def test_home_and_file_uri(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_uri("~/corpus", LOCAL)[1] == str(tmp_path / "corpus")
    fs, path = resolve_uri(f"file://{tmp_path}/corpus", LOCAL)
    assert isinstance(fs, pafs.LocalFileSystem)
    assert path == f"{tmp_path}/corpus"


def test_local_paths_ignore_s3_settings_and_pass_the_bucket_check(tmp_path):
    fs, path = resolve_uri(str(tmp_path), LOOPBACK)
    assert isinstance(fs, pafs.LocalFileSystem)
    check_bucket(fs, path)  # nothing to check, nothing raised
    assert display_uri(fs, path) == str(tmp_path)


@pytest.mark.parametrize(("role", "error"), [("input", InputError), ("output", OutputError)])
def test_other_schemes_and_bucketless_uris_are_usage_errors(role, error):
    with pytest.raises(error, match="local paths and s3:// URIs"):
        resolve_uri("gs://bucket/x", LOCAL, role)
    with pytest.raises(error, match="names no bucket"):
        resolve_uri("s3:///", LOCAL, role)


def test_s3_uri_becomes_bucket_and_key_with_the_configured_endpoint():
    fs, path = resolve_uri("s3://in-bucket/corpus/", LOOPBACK)
    assert isinstance(fs, pafs.S3FileSystem)
    assert path == "in-bucket/corpus"
    assert display_uri(fs, path) == "s3://in-bucket/corpus"
    options = _pyarrow_options(fs)
    assert options["endpoint_override"] == "127.0.0.1:9000"
    assert options["scheme"] == "http"
    assert options["region"] == "eu-west-1"
    # credentials come from the AWS chain in each process: never held explicitly
    assert options["access_key"] is None and options["secret_key"] is None
    https = resolve_uri("s3://b/k", StorageConfig(s3_endpoint="https://s3.example.com"))[0]
    assert _pyarrow_options(https)["scheme"] == "https"


def test_s3_filesystem_pickles_with_its_settings_for_ray_workers():
    fs, _ = resolve_uri("s3://in-bucket/corpus", LOOPBACK)
    again = pickle.loads(pickle.dumps(fs))
    assert isinstance(again, ConfiguredS3FileSystem)
    # pyarrow's own pickling would drop the retry strategy (3 attempts on every worker)
    assert again.__reduce__() == fs.__reduce__()
    assert again.__reduce__()[1] == ("http://127.0.0.1:9000", "eu-west-1", 4)
    assert _pyarrow_options(again)["endpoint_override"] == "127.0.0.1:9000"


@pytest.mark.parametrize("endpoint", ["127.0.0.1:9000", "ftp://host", "http://host/path"])
def test_bad_endpoint_is_a_config_error(endpoint):
    with pytest.raises(ConfigError, match="s3_endpoint"):
        resolve_uri("s3://b/k", StorageConfig(s3_endpoint=endpoint))


@pytest.mark.parametrize(
    ("detail", "hint"),
    [
        (ACCESS_DENIED, "access denied; check the AWS credentials"),
        (NO_SUCH_BUCKET, "bucket 'in-bucket' does not exist; check the bucket name"),
        (NO_CONNECTION, "cannot reach the S3 endpoint; check [storage] s3_endpoint"),
        ("AWS Error SLOW_DOWN during GetObject operation", "the S3 request failed"),
    ],
)
def test_s3_error_names_bucket_key_and_what_to_check(detail, hint):
    err = s3_error(OSError(detail), "s3://in-bucket/corpus")
    assert isinstance(err, InputError)
    msg = str(err)
    assert msg.startswith("input s3://in-bucket/corpus: ")
    assert hint in msg
    assert "bucket 'in-bucket', key 'corpus'" in msg
    assert detail in msg  # the server's own words stay, for whoever debugs it


def test_s3_error_for_output_asks_for_write_access():
    err = s3_error(OSError(ACCESS_DENIED), "s3://out-bucket", "output")
    assert isinstance(err, OutputError)
    assert "may list, read and write this bucket" in str(err)
    assert "(bucket 'out-bucket'; S3 said:" in str(err)  # a bare bucket: no key named


def test_s3_error_never_repeats_the_secret_key(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    echoed = OSError(f"{ACCESS_DENIED} (signature computed with {SECRET})")
    msg = str(s3_error(echoed, "s3://in-bucket/corpus"))
    assert SECRET not in msg
    assert "***" in msg and "access denied" in msg


def test_bare_glob_base_is_the_working_directory():
    # resolve_input hands resolve_uri the folder before a glob ("." for a bare pattern)
    fs, path = resolve_uri(".", LOCAL)
    assert isinstance(fs, pafs.LocalFileSystem)
    assert path == str(Path.cwd())


@pytest.fixture
def no_endpoint_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENDPOINT_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # no region look-up
    return monkeypatch


def test_aws_endpoint_url_is_honoured_when_the_config_has_none(no_endpoint_env):
    no_endpoint_env.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9100")
    fs, _ = resolve_uri("s3://b/k", StorageConfig(s3_region="us-east-1"))
    assert _pyarrow_options(fs)["endpoint_override"] == "127.0.0.1:9100"
    # resolved here, on the driver: workers get it with the pickled filesystem
    assert fs.__reduce__()[1][0] == "http://127.0.0.1:9100"
    # the S3-specific variable wins over the general one, as in boto3 and the AWS CLI
    no_endpoint_env.setenv("AWS_ENDPOINT_URL_S3", "https://minio.example.com")
    assert effective_endpoint(StorageConfig()) == (
        "https://minio.example.com",
        "AWS_ENDPOINT_URL_S3",
    )
    # the config key wins over both
    assert effective_endpoint(LOOPBACK)[0] == "http://127.0.0.1:9000"


@pytest.mark.parametrize("where", ["config", "env"])
def test_credentials_in_an_endpoint_url_are_refused_without_echoing_them(
    where: str, no_endpoint_env
) -> None:
    url = f"http://AKIAEXAMPLE:{SECRET}@127.0.0.1:9000"
    with pytest.raises(ConfigError) as exc:
        if where == "config":
            load_config(None, {"storage.s3_endpoint": url})
        else:
            no_endpoint_env.setenv("AWS_ENDPOINT_URL", url)
            resolve_uri("s3://b/k", StorageConfig())
    assert "credentials" in str(exc.value)
    assert SECRET not in str(exc.value) and "AKIAEXAMPLE" not in str(exc.value)
