"""Credentials in an S3 endpoint are refused in every form, and never echoed (issue 20, 9).

``KEY:SECRET@host:9000`` without a scheme used to pass the config check (which looked for
"@" only after "://"), land in ``_manifest.json`` with the rest of the config, and come
back in the "not an endpoint URL" message of an S3 run.
"""

from __future__ import annotations

import pytest

from docintel.pipeline.config import StorageConfig, load_config
from docintel.pipeline.errors import ConfigError
from docintel.pipeline.storage import ENDPOINT_ENVS, resolve_uri

KEY, SECRET = "AKIAUNITTEST", "endpoint-secret-5d1e"
WITH_CREDENTIALS = [
    f"{KEY}:{SECRET}@127.0.0.1:9000",  # no scheme: the case that slipped through
    f"{KEY}:{SECRET}@minio.internal:9000/bucket",
    f"//{KEY}:{SECRET}@127.0.0.1:9000",  # scheme-relative
    f"{SECRET}@127.0.0.1",  # a bare token as the user part
    f"http://{KEY}:{SECRET}@127.0.0.1:9000",
    f"https://{KEY}:{SECRET}@s3.example.com/",
]


@pytest.fixture
def no_endpoint_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ENDPOINT_ENVS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # no region look-up
    return monkeypatch


def _assert_not_echoed(message: str) -> None:
    assert SECRET not in message and KEY not in message, message


@pytest.mark.parametrize("endpoint", WITH_CREDENTIALS)
def test_the_config_refuses_userinfo_with_or_without_a_scheme(endpoint: str) -> None:
    with pytest.raises(ConfigError, match=r"credentials \(user:password@\)") as exc:
        load_config(None, {"storage.s3_endpoint": endpoint})
    _assert_not_echoed(str(exc.value))


@pytest.mark.parametrize("endpoint", WITH_CREDENTIALS)
def test_the_aws_endpoint_variable_is_refused_the_same_way(
    endpoint: str, no_endpoint_env: pytest.MonkeyPatch
) -> None:
    no_endpoint_env.setenv("AWS_ENDPOINT_URL", endpoint)
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL holds credentials") as exc:
        resolve_uri("s3://bucket/key", StorageConfig())
    _assert_not_echoed(str(exc.value))


@pytest.mark.parametrize(
    "endpoint",
    [f"{KEY}:{SECRET}", f"ftp://{SECRET}", f"http://host/{SECRET}", f"http://host:{SECRET}"],
)
def test_a_malformed_endpoint_is_refused_without_repeating_it(
    endpoint: str, no_endpoint_env: pytest.MonkeyPatch
) -> None:
    """No "@", but not an endpoint either: it may hold a secret in a form we do not know."""
    for where in ("config", "env"):
        with pytest.raises(ConfigError, match="is not an endpoint URL") as exc:
            if where == "config":
                resolve_uri(
                    "s3://b/k", load_config(None, {"storage.s3_endpoint": endpoint}).storage
                )
            else:
                no_endpoint_env.setenv("AWS_ENDPOINT_URL", endpoint)
                resolve_uri("s3://b/k", StorageConfig())
        _assert_not_echoed(str(exc.value))
        assert ("[storage] s3_endpoint" if where == "config" else "AWS_ENDPOINT_URL") in str(
            exc.value
        )


def test_plain_endpoints_still_pass(no_endpoint_env: pytest.MonkeyPatch) -> None:
    for endpoint in ("http://127.0.0.1:9000", "https://s3.example.com", "http://[::1]:9000/"):
        cfg = load_config(None, {"storage.s3_endpoint": endpoint})
        assert resolve_uri("s3://b/k", cfg.storage)[1] == "b/k"
