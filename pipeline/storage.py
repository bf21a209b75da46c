"""Where data lives: a local path or an ``s3://bucket/prefix`` URI, as a pyarrow filesystem.

Credentials come only from the standard AWS chain (environment, shared profile, instance
or pod role). They are never passed to pyarrow, so pyarrow never pickles them: every Ray
worker resolves the chain in its own environment. They never appear in messages, logs or
the manifest.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

import pyarrow as pa
import pyarrow.fs as pafs

from docintel.pipeline.config import StorageConfig
from docintel.pipeline.errors import ConfigError, InputError, OutputError, UsageError

S3_SCHEME = "s3://"
Role = Literal["input", "output"]

# Values of these variables are blanked out of any S3 error text we pass on. The AWS SDK
# does not echo secrets in its errors; this keeps it so whatever a server sends back.
_SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_ACCESS_CODES = (
    "ACCESS_DENIED",
    "AccessDenied",
    "INVALID_ACCESS_KEY_ID",
    "InvalidAccessKeyId",
    "SIGNATURE_DOES_NOT_MATCH",
    "SignatureDoesNotMatch",
    "EXPIRED_TOKEN",
    "ExpiredToken",
)
_BUCKET_CODES = ("NO_SUCH_BUCKET", "NoSuchBucket")
# The AWS SDKs' standard endpoint settings (boto3, the AWS CLI), most specific first: used
# when [storage] s3_endpoint is empty, so an S3-compatible store (MinIO, Ceph) configured
# for every other AWS tool works here too.
ENDPOINT_ENVS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
_NETWORK_CODES = ("NETWORK_CONNECTION", "curlCode")


class ConfiguredS3FileSystem(pafs.S3FileSystem):
    """pyarrow's S3 filesystem that pickles as the settings it was made from.

    pyarrow's own pickling drops the retry strategy, so on Ray workers (where batches are
    read and written) every request would get 3 attempts whatever ``s3_attempts`` says.
    Credentials are not among the settings.
    """

    def __init__(self, endpoint: str, region: str, attempts: int) -> None:
        options: dict[str, str] = {}
        if endpoint:
            url = check_endpoint(endpoint, "[storage] s3_endpoint")
            options = {"endpoint_override": url.netloc, "scheme": url.scheme}
        if region:
            options["region"] = region
        super().__init__(
            retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=attempts),
            # no CreateMultipartUpload round trip at open: a part file is one PUT at close
            allow_delayed_open=True,
            **options,
        )
        self._settings = (endpoint, region, attempts)

    def __reduce__(self) -> tuple[type[ConfiguredS3FileSystem], tuple[str, str, int]]:
        return (ConfiguredS3FileSystem, self._settings)

    def boto3_client(self) -> Any:
        """A boto3 S3 client with the same endpoint, region and retries, for what pyarrow
        lacks: conditional writes, batch deletes without folder markers."""
        import boto3
        from botocore.config import Config as BotoConfig

        endpoint, region, attempts = self._settings
        retries = {"max_attempts": attempts, "mode": "standard"}
        return boto3.client(
            "s3",
            endpoint_url=endpoint or None,
            region_name=region or None,
            config=BotoConfig(retries=retries),  # type: ignore[arg-type]
        )


def check_endpoint(endpoint: str, source: str) -> SplitResult:
    """An S3 endpoint URL, checked: scheme, host, optional port, nothing else.

    Credentials in it (``http://KEY:SECRET@host``, or ``KEY:SECRET@host`` without a scheme)
    are refused: they would travel in the config, the manifest and every pickled
    filesystem. No message repeats the value (``source`` names where it came from): a
    value that is not a plain endpoint may hold a secret in a form we do not recognise.
    """
    if "@" in endpoint:  # userinfo, whatever the scheme; an endpoint has no other "@"
        raise ConfigError(
            f"{source} holds credentials (user:password@ in the URL); docintel refuses them. "
            "Give only scheme, host and port, and the credentials through the AWS chain "
            "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or an instance/pod role)"
        )
    url = urlsplit(endpoint)
    try:
        valid = url.scheme in ("http", "https") and bool(url.hostname) and url.port != 0
    except ValueError:  # a port that is not a number, or out of range
        valid = False
    if not valid or url.path not in ("", "/") or url.query or url.fragment:
        raise ConfigError(
            f"{source} is not an endpoint URL (its value is not repeated here); write only "
            'the scheme, host and port, e.g. "http://127.0.0.1:9000" or '
            '"https://s3.example.com" (the scheme decides TLS)'
        )
    return url


def effective_endpoint(storage: StorageConfig) -> tuple[str, str]:
    """The S3 endpoint and where it came from: ``[storage] s3_endpoint``, else the AWS
    SDKs' AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, else "" (AWS itself)."""
    if storage.s3_endpoint:
        return storage.s3_endpoint, "[storage] s3_endpoint"
    for name in ENDPOINT_ENVS:
        value = os.environ.get(name, "").strip()
        if value:
            return value, name
    return "", ""


def s3_filesystem(storage: StorageConfig) -> ConfiguredS3FileSystem:
    """The S3 filesystem for ``storage``; the endpoint is resolved here, on the driver, and
    travels to the workers with the pickled filesystem (they need no environment for it)."""
    endpoint, source = effective_endpoint(storage)
    if endpoint:
        check_endpoint(endpoint, source)
    return ConfiguredS3FileSystem(endpoint, storage.s3_region, storage.s3_attempts)


def resolve_uri(
    uri: str, storage: StorageConfig, role: Role = "input"
) -> tuple[pafs.FileSystem, str]:
    """The filesystem and the path inside it that ``uri`` names (no I/O).

    A local path becomes an absolute, resolved path on the local filesystem;
    ``s3://bucket/prefix`` becomes ``bucket/prefix`` on S3 as ``storage`` configures it.
    """
    error = _error_class(role)
    if uri.startswith(S3_SCHEME):
        path = uri[len(S3_SCHEME) :].strip("/")
        if not path:
            raise error(f"{role} {uri!r} names no bucket; write s3://BUCKET/PREFIX")
        return s3_filesystem(storage), path
    if uri.startswith("file://"):
        try:
            return pafs.LocalFileSystem(), pafs.FileSystem.from_uri(uri)[1]
        except pa.ArrowInvalid as e:
            raise error(f"{role} {uri!r} is not a valid file:// URI ({e})") from e
    if "://" in uri:
        raise error(f"{role} {uri!r}: docintel reads and writes local paths and s3:// URIs only")
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().resolve())


def is_local(fs: pafs.FileSystem) -> bool:
    return isinstance(fs, pafs.LocalFileSystem)


def display_uri(fs: pafs.FileSystem, path: str) -> str:
    """How a path inside ``fs`` is shown to people: ``s3://bucket/key`` or a local path."""
    return f"{S3_SCHEME}{path}" if isinstance(fs, pafs.S3FileSystem) else path


def check_bucket(fs: pafs.FileSystem, path: str, role: Role = "input") -> None:
    """Raise a usage error naming the bucket if ``path``'s bucket is missing or forbidden.

    Local paths pass without I/O.
    """
    if not isinstance(fs, pafs.S3FileSystem):
        return
    bucket = path.split("/", 1)[0]
    try:
        found = fs.get_file_info(bucket).type != pafs.FileType.NotFound
    except OSError as e:
        raise s3_error(e, f"{S3_SCHEME}{path}", role) from e
    if not found:
        raise _error_class(role)(f"{role} {S3_SCHEME}{path}: {_no_bucket(bucket)}")


def s3_error(e: OSError, uri: str, role: Role = "input") -> UsageError:
    """A clear usage error for an S3 request that failed: bucket, key and what to check.

    ``raise s3_error(e, uri) from e``. The text never holds a secret key.
    """
    path = uri.removeprefix(S3_SCHEME)
    bucket, _, key = path.partition("/")
    where = f"bucket {bucket!r}" + (f", key {key!r}" if key else "")
    detail = _redact(str(e))
    return _error_class(role)(
        f"{role} {S3_SCHEME}{path}: {_hint(detail, bucket, role)} ({where}; S3 said: {detail})"
    )


def _hint(detail: str, bucket: str, role: Role) -> str:
    if any(code in detail for code in _ACCESS_CODES):
        may = "list and read" if role == "input" else "list, read and write"
        return (
            "access denied; check the AWS credentials (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the instance or pod role) and that "
            f"they may {may} this bucket"
        )
    if any(code in detail for code in _BUCKET_CODES):
        return _no_bucket(bucket)
    if any(code in detail for code in _NETWORK_CODES):
        return "cannot reach the S3 endpoint; check [storage] s3_endpoint and the network"
    return "the S3 request failed"


def _no_bucket(bucket: str) -> str:
    return (
        f"bucket {bucket!r} does not exist; check the bucket name and "
        "[storage] s3_endpoint and s3_region"
    )


def _redact(text: str) -> str:
    for name in _SECRET_VARIABLES:
        secret = os.environ.get(name)
        if secret:
            text = text.replace(secret, "***")
    return text


def _error_class(role: Role) -> type[UsageError]:
    return InputError if role == "input" else OutputError
