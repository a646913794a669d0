"""OPSERVE_CLUSTER_REDIS_URL checked once at start-up, before the server starts: a URL redis-py
cannot take, or a Redis that refuses the credentials, can never work, so the process stops with
one line naming the setting (never its password); a Redis that does not answer yet may be
starting too (Kubernetes starts pods in any order), so the server starts and says so loudly.
What needs the store answers 503 until it answers (docs/deployment.md, "Running it")."""

import redis
from redis.exceptions import AuthenticationError, NoPermissionError, RedisError, ResponseError

SETTING = "OPSERVE_CLUSTER_REDIS_URL"


class StoreConfigError(Exception):
    """A setting of the cluster store that cannot work: the message is one line for the user."""


def redacted(url: str) -> str:
    """`url` with its password (or a user-info that may be one) replaced by `***`."""
    head, at, tail = url.rpartition("@")
    if not at:
        return url
    scheme, sep, userinfo = head.rpartition("://")
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{sep}{user}:***@{tail}" if colon else f"{scheme}{sep}***@{tail}"


def check_store(url: str, timeout: float) -> str | None:
    """Raise StoreConfigError when `url` cannot work; None when Redis answered, else a one-line
    warning (Redis unreachable, which may pass)."""
    shown = f"{SETTING}={redacted(url)}"
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    except ValueError as exc:  # no scheme, a port that is no number, a db that is no number
        raise StoreConfigError(f"{shown}: not a Redis URL ({exc}); write "
                               "redis://[:password@]host:port/db, or rediss:// for TLS") from None  # fmt: skip
    try:
        client.ping()
    except AuthenticationError as exc:  # a wrong password, or none where Redis wants one
        raise StoreConfigError(f"{shown}: Redis refused the credentials ({_first_line(exc)}); "
                               "check the password (and user) in the URL") from None  # fmt: skip
    except NoPermissionError as exc:
        raise StoreConfigError(f"{shown}: Redis's ACL user may not run commands opserve needs "
                               f"({_first_line(exc)})") from None  # fmt: skip
    except ResponseError as exc:  # e.g. a database number past Redis's `databases`
        raise StoreConfigError(f"{shown}: Redis refused the connection's set-up "
                               f"({_first_line(exc)})") from None  # fmt: skip
    except (RedisError, OSError) as exc:  # unreachable: refused, timed out, a name not found
        return (f"{shown}: the cluster store (Redis) is unreachable ({_first_line(exc)}); "
                "starting anyway: calls that need it (sequences, repository control) answer "
                "503 until it answers")  # fmt: skip
    finally:
        client.close()
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]
