"""S3-compatible checkpoint storage: `s3://bucket/prefix/<uuid>/<file>` through boto3.

boto3 is imported when the first client is made, never at import time. Works with AWS and
with any S3-compatible server (MinIO, Ceph, moto) given `endpoint_url`. Credentials come
from the config's `access_key`/`secret_key` when set, else from boto3's usual chain
(AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE and ~/.aws, an instance role).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from assay.common.storage._base import (
    MANIFEST,
    S3_SCHEME,
    StorageError,
    checkpoint_files,
    safe_name,
)

if TYPE_CHECKING:
    from assay.config import CheckpointStorageConfig

_DELETE_BATCH = 1000  # the most keys one DeleteObjects call takes


def parse_s3_location(location: str) -> tuple[str, str, str]:
    """`s3://bucket/a/b/uuid` -> ("bucket", "a/b", "uuid")."""
    if not location.startswith(S3_SCHEME):
        raise StorageError(f"{location!r} is not an s3:// location")
    bucket, _, key = location[len(S3_SCHEME) :].partition("/")
    parts = [p for p in key.split("/") if p]
    if not bucket or not parts:
        raise StorageError(f"{location!r} is not an s3://bucket/[prefix/]uuid location")
    return bucket, "/".join(parts[:-1]), parts[-1]


class S3Storage:
    """Checkpoints as the objects under `prefix/<uuid>/` in one bucket."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url
        self.region = region
        self._access_key = access_key
        self._secret_key = secret_key
        self._client: Any = None

    def __repr__(self) -> str:
        where = f", endpoint_url={self.endpoint_url!r}" if self.endpoint_url else ""
        return f"S3Storage({self.bucket!r}, {self.prefix!r}{where})"

    @classmethod
    def from_config(
        cls,
        config: CheckpointStorageConfig | None,
        *,
        bucket: str | None = None,
        prefix: str | None = None,
    ) -> S3Storage:
        """Storage for `config` (type s3); `bucket`/`prefix` override it (from a location)."""
        s3 = config if config is not None and config.type == "s3" else None
        name = bucket or (s3.bucket if s3 is not None else None)
        if not name:
            raise StorageError("checkpoint_storage.bucket is not set")
        return cls(
            name,
            prefix if prefix is not None else (s3.prefix if s3 is not None else ""),
            endpoint_url=s3.endpoint_url if s3 is not None else None,
            region=s3.region if s3 is not None else None,
            access_key=s3.access_key if s3 is not None else None,
            secret_key=s3.secret_key if s3 is not None else None,
        )

    @property
    def client(self) -> Any:
        if self._client is None:
            import boto3

            session = boto3.session.Session(
                aws_access_key_id=self._access_key,
                aws_secret_access_key=self._secret_key,
                region_name=self.region,
            )
            self._client = session.client("s3", endpoint_url=self.endpoint_url)
        return self._client

    def _key(self, uuid: str, name: str = "") -> str:
        if safe_name(uuid).name != uuid:
            raise StorageError(f"{uuid!r} is not a checkpoint uuid")
        base = f"{self.prefix}/{uuid}" if self.prefix else uuid
        return f"{base}/{name}" if name else f"{base}/"

    def location(self, uuid: str) -> str:
        return f"{S3_SCHEME}{self.bucket}/{self._key(uuid).rstrip('/')}"

    def _fail(self, action: str, uuid: str, error: Exception) -> StorageError:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return StorageError(
            f"cannot {action} checkpoint {uuid} in s3://{self.bucket}{where}: {_describe(error)}"
        )

    def upload(self, local_dir: Path, uuid: str) -> str:
        local_dir = Path(local_dir)
        names = checkpoint_files(local_dir)
        if MANIFEST not in names:
            raise StorageError(f"{local_dir} is not a checkpoint: it has no {MANIFEST}")
        try:
            for name in names:  # the manifest last: until it is there, the upload is partial
                self.client.upload_file(str(local_dir / name), self.bucket, self._key(uuid, name))
        except Exception as e:
            raise self._fail("upload", uuid, e) from None
        return self.location(uuid)

    def upload_part(self, local_dir: Path, uuid: str) -> None:
        """Store the files of `local_dir` under checkpoint `uuid` without a manifest: one
        process's shard of a checkpoint whose chief uploads the manifest last."""
        try:
            for name in checkpoint_files(Path(local_dir)):
                self.client.upload_file(str(local_dir / name), self.bucket, self._key(uuid, name))
        except Exception as e:
            raise self._fail("upload", uuid, e) from None

    def download_tree(
        self, top: str, name: str, local_dir: Path, skipped: list[str] | None = None
    ) -> int:
        """Copy every object under `top/name/` (e.g. `tensorboard`, `trial-7`) into
        `local_dir`; return how many were copied. Objects whose key would leave
        `local_dir` (`..`, an absolute or empty name) or land on a directory are left
        out, each added to `skipped` with why."""
        prefix = self._key(top, safe_name(name).as_posix()).rstrip("/") + "/"
        skipped = [] if skipped is None else skipped
        copied = 0
        try:
            keys: list[str] = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                keys.extend(obj["Key"] for obj in page.get("Contents", []))
            for key in keys:
                target = _inside(Path(local_dir), key[len(prefix) :])
                if target is None:
                    skipped.append(f"s3://{self.bucket}/{key}: a name that leaves {local_dir}")
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                if target.is_dir() or target.is_symlink():
                    skipped.append(f"s3://{self.bucket}/{key}: {target} is taken")
                    continue
                self.client.download_file(self.bucket, key, str(target))
                copied += 1
        except StorageError:
            raise
        except Exception as e:
            raise self._fail("download", top, e) from None
        return copied

    def _list(self, uuid: str) -> list[str]:
        prefix = self._key(uuid)
        keys: list[str] = []
        paginator = self.client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return keys

    def download(self, uuid: str, local_dir: Path) -> None:
        prefix = self._key(uuid)
        try:
            keys = self._list(uuid)
        except Exception as e:
            raise self._fail("list", uuid, e) from None
        names = [key[len(prefix) :] for key in keys]
        if MANIFEST not in names:
            raise StorageError(
                f"checkpoint {uuid} is not complete in {self.location(uuid)}: it has no "
                f"{MANIFEST} ({len(names)} other objects)"
            )
        local_dir = Path(local_dir)
        try:
            for name in names:
                target = local_dir.joinpath(*safe_name(name).parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.client.download_file(self.bucket, prefix + name, str(target))
        except StorageError:
            raise
        except Exception as e:
            raise self._fail("download", uuid, e) from None

    def download_file(self, uuid: str, name: str, target: Path) -> None:
        """Copy one file of checkpoint `uuid` to `target`."""
        key = self._key(uuid, safe_name(name).as_posix())
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            self.client.download_file(self.bucket, key, str(target))
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey"):
                missing = f"checkpoint {uuid} has no {name} in {self.location(uuid)}"
                raise StorageError(missing) from None
            raise self._fail("download", uuid, e) from None

    def delete(self, uuid: str) -> bool:
        try:
            keys = self._list(uuid)
            if not keys:
                return False
            manifest = self._key(uuid, MANIFEST)
            if manifest in keys:  # first: what is left is never taken for a whole checkpoint
                keys.remove(manifest)
                self.client.delete_object(Bucket=self.bucket, Key=manifest)
            for start in range(0, len(keys), _DELETE_BATCH):
                batch = keys[start : start + _DELETE_BATCH]
                answer = self.client.delete_objects(
                    Bucket=self.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
                errors = answer.get("Errors") or []
                if errors:
                    first = errors[0]
                    raise StorageError(
                        f"cannot delete {first.get('Key')} of checkpoint {uuid} in "
                        f"s3://{self.bucket}: {first.get('Code')} {first.get('Message', '')}"
                    )
        except StorageError:
            raise
        except Exception as e:
            raise self._fail("delete", uuid, e) from None
        return True

    def exists(self, uuid: str) -> bool:
        try:
            self.client.head_object(Bucket=self.bucket, Key=self._key(uuid, MANIFEST))
        except Exception as e:
            if _code(e) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise self._fail("look up", uuid, e) from None
        return True


def _code(error: Exception) -> str:
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        return str(response.get("Error", {}).get("Code", ""))
    return ""


def _inside(root: Path, name: str) -> Path | None:
    """`root/name`, or None for a name that would leave `root`."""
    try:
        return root.joinpath(*safe_name(name).parts)
    except StorageError:
        return None


def _describe(error: Exception) -> str:
    code = _code(error)
    text = str(error).strip().replace("\n", " ") or type(error).__name__
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
        return (
            f"{text} (check checkpoint_storage.access_key/secret_key or the AWS_* "
            "credentials of this process)"
        )
    if type(error).__name__ == "NoCredentialsError":
        return (
            "no S3 credentials: set checkpoint_storage.access_key/secret_key, or "
            "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        )
    return text


__all__ = ["S3Storage", "parse_s3_location"]
