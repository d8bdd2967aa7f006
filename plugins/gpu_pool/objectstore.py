"""S3-compatible object storage for snapshots and reports: MinIO, a cloud object store, AWS.

Terms
-----
connection
    An Airflow connection (default id ``gpu_pool_s3``). ``login``/``password`` are the access
    key and secret; extras hold ``endpoint_url`` (omit for AWS), ``bucket`` (required),
    ``prefix`` (optional, e.g. ``gpu-pool/prod``) and ``region_name``. Credentials come from
    the connection only: they are never in code, in a log line or in an error message.
key
    The path of an object below the configured prefix (``ledger/dt=2026-12-01/part-0.csv``).
    Writing the same key twice overwrites the object: snapshot writers rely on that for
    idempotent reruns, bucket versioning keeps the history.
history
    Whether the bucket keeps what an overwrite replaces (:meth:`S3ObjectStore.keeps_history`:
    versioning enabled). Many S3-compatible stores have no versioning; there, writers put
    each export under keys of its own (:func:`export_key`) so no export destroys another.

Every failure to reach or use the store is an :class:`ObjectStoreError` that names the
endpoint, bucket and key, never a botocore traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from gpu_pool.errors import GpuPoolError, SpecError

DEFAULT_CONN_ID = "gpu_pool_s3"


class ObjectStoreError(GpuPoolError):
    """The object store could not be reached or refused an operation."""


class ObjectStore(Protocol):
    """What the ops code needs from object storage."""

    def put_bytes(self, key: str, data: bytes, content_type: str = ...) -> str: ...

    def get_bytes(self, key: str) -> bytes: ...

    def list_keys(self, prefix: str = "") -> list[str]: ...

    def keeps_history(self) -> bool: ...


def export_key(folder: str, name: str, exported_at: datetime | None) -> str:
    """``folder/name``, or ``folder/exported_at=<UTC time>/name`` for an export that must not
    replace an earlier one (a bucket that keeps no history); readers take the latest."""
    if exported_at is None:
        return f"{folder}/{name}"
    return f"{folder}/exported_at={exported_at.astimezone(UTC):%Y%m%dT%H%M%S%fZ}/{name}"


@dataclass(frozen=True)
class ObjectStoreConfig:
    """Where objects go. Secrets are kept out of ``repr`` so a log of the config leaks nothing."""

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region_name: str | None = None
    access_key: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    max_attempts: int = 3
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.bucket or "/" in self.bucket:
            raise SpecError("bucket", self.bucket,
                            "a bucket name without '/' (set extra 'bucket' on the connection)")
        if self.endpoint_url is not None and not self.endpoint_url.startswith(
                ("http://", "https://")):
            raise SpecError("endpoint_url", self.endpoint_url,
                            "an http:// or https:// URL, or no endpoint_url for AWS")
        if self.max_attempts < 1:
            raise SpecError("max_attempts", self.max_attempts, "an integer >= 1")

    @property
    def where(self) -> str:
        """A secret-free description for messages: ``s3://bucket/prefix at endpoint``."""
        at = self.endpoint_url or "AWS"
        return f"s3://{self.bucket}/{self.prefix.strip('/')} at {at}"

    def full_key(self, key: str) -> str:
        prefix = self.prefix.strip("/")
        key = key.lstrip("/")
        return f"{prefix}/{key}" if prefix else key


def config_from_extras(extras: Mapping[str, Any], *, login: str | None = None,
                       password: str | None = None) -> ObjectStoreConfig:
    """The config of an Airflow connection's parts (extras, login, password)."""
    bucket = extras.get("bucket")
    if not bucket:
        raise SpecError("bucket", bucket, "the bucket name in the connection's extra 'bucket'")
    attempts = extras.get("max_attempts", 3)
    try:
        attempts = int(attempts)
    except (TypeError, ValueError):
        raise SpecError("max_attempts", attempts, "an integer >= 1") from None
    return ObjectStoreConfig(
        bucket=str(bucket),
        prefix=str(extras.get("prefix") or ""),
        endpoint_url=extras.get("endpoint_url") or None,
        region_name=extras.get("region_name") or None,
        access_key=login or extras.get("aws_access_key_id") or None,
        secret_key=password or extras.get("aws_secret_access_key") or None,
        max_attempts=attempts,
    )


def config_from_airflow(conn_id: str = DEFAULT_CONN_ID) -> ObjectStoreConfig:
    """The config of the Airflow connection ``conn_id`` (imports Airflow only when called)."""
    from airflow.sdk import BaseHook

    try:
        conn = BaseHook.get_connection(conn_id)
    except Exception as error:  # Airflow raises its own not-found type
        raise ObjectStoreError(
            f"object store connection {conn_id!r} is not defined: add it with "
            f"`airflow connections add {conn_id} --conn-type aws --conn-login KEY "
            "--conn-password SECRET --conn-extra '{\"endpoint_url\": \"https://...\", "
            "\"bucket\": \"...\"}'`") from error
    return config_from_extras(conn.extra_dejson or {}, login=conn.login, password=conn.password)


class S3ObjectStore:
    """An :class:`ObjectStore` over boto3; botocore retries transient failures itself."""

    def __init__(self, config: ObjectStoreConfig) -> None:
        import boto3
        from botocore.config import Config

        self.config = config
        self._client = boto3.session.Session().client(
            "s3",
            endpoint_url=config.endpoint_url,
            region_name=config.region_name or "us-east-1",
            aws_access_key_id=config.access_key,
            aws_secret_access_key=config.secret_key,
            config=Config(
                retries={"max_attempts": config.max_attempts, "mode": "standard"},
                connect_timeout=config.connect_timeout_s,
                read_timeout=config.read_timeout_s,
                s3={"addressing_style": "path"},
            ),
        )
        self._history: bool | None = None

    def _fail(self, action: str, key: str, error: Exception) -> ObjectStoreError:
        from botocore.exceptions import ClientError

        if isinstance(error, ClientError):
            code = error.response.get("Error", {}).get("Code", "?")
            reason = f"the store answered {code}"
        else:
            reason = f"cannot reach it ({type(error).__name__})"
        return ObjectStoreError(
            f"object store {self.config.where}: could not {action} {key!r}: {reason}")

    def put_bytes(self, key: str, data: bytes,
                  content_type: str = "application/octet-stream") -> str:
        """Write (or overwrite) ``key``; returns the full key written."""
        full = self.config.full_key(key)
        try:
            self._client.put_object(Bucket=self.config.bucket, Key=full, Body=data,
                                    ContentType=content_type)
        except Exception as error:
            raise self._fail("write", full, error) from error
        return full

    def get_bytes(self, key: str) -> bytes:
        full = self.config.full_key(key)
        try:
            body = self._client.get_object(Bucket=self.config.bucket, Key=full)["Body"]
            return body.read()
        except Exception as error:
            raise self._fail("read", full, error) from error

    def list_keys(self, prefix: str = "") -> list[str]:
        """Keys below ``prefix`` (relative to the configured prefix), sorted."""
        full = self.config.full_key(prefix)
        base = self.config.full_key("")
        keys: list[str] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.config.bucket, Prefix=full)
            for page in pages:
                keys.extend(obj["Key"][len(base):].lstrip("/")
                            for obj in page.get("Contents", []))
        except Exception as error:
            raise self._fail("list", full, error) from error
        return sorted(keys)

    def keeps_history(self) -> bool:
        """Whether the bucket's versioning is enabled (asked once per store object).

        A store that will not say (no permission, no versioning API) is taken to keep none:
        writing each export under its own key is safe either way.
        """
        if self._history is None:
            try:
                answer = self._client.get_bucket_versioning(Bucket=self.config.bucket)
                self._history = answer.get("Status") == "Enabled"
            except Exception as error:
                from botocore.exceptions import ClientError

                if not isinstance(error, ClientError):  # unreachable: say so, as writes do
                    raise self._fail("read the versioning of", self.config.bucket,
                                     error) from error
                self._history = False
        return self._history

    def ensure_bucket(self) -> None:
        """Create the bucket when missing (for a fresh MinIO), with versioning on so that
        reruns keep the history; a no-op when it exists."""
        try:
            self._client.head_bucket(Bucket=self.config.bucket)
            return
        except Exception:
            pass
        try:
            self._client.create_bucket(Bucket=self.config.bucket)
            self._client.put_bucket_versioning(
                Bucket=self.config.bucket, VersioningConfiguration={"Status": "Enabled"})
        except Exception as error:
            raise self._fail("create bucket", self.config.bucket, error) from error
        self._history = None
