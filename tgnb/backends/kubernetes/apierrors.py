"""What the Kubernetes backend and its placer plumbing make of the API's answers.

`api_error` turns a failed call into a one-line tgnb error, `status_message` reads the first line
of an `ApiException`'s Status message, and `event_time` is when a core/v1 Event happened.
"""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.exceptions import ApiException

from tgnb.errors import ApiNotFoundError, AuthenticationError, BackendError, TgnbError
from tgnb.events import parse_time


def event_time(item: Any) -> Any:
    """When the Event happened: its first timestamp, event time or last timestamp, else when it
    was created."""
    for value in (item.first_timestamp, item.event_time, item.last_timestamp):
        if value is not None:
            return parse_time(value)
    created = item.metadata.creation_timestamp if item.metadata else None
    return parse_time(created) if created is not None else parse_time(0)


def api_error(exc: BaseException, doing: str) -> TgnbError:
    """A one-line tgnb error for a failed call to the Kubernetes API."""
    if isinstance(exc, ApiException):
        detail = status_message(exc)
        if exc.status in (401, 403):
            return AuthenticationError(
                f"the Kubernetes API refused to {doing} ({exc.status}: {detail}): "
                "check the cluster's kube_config and the namespace's permissions",
                exc.status,
            )
        if exc.status == 404:
            return ApiNotFoundError(f"could not {doing}: {detail} (404)", 404)
        return BackendError(
            f"could not {doing}: the Kubernetes API answered {exc.status}: {detail}"
        )
    if isinstance(exc, TgnbError):
        return exc
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return BackendError(f"could not reach the Kubernetes API to {doing}: {first}")


def status_message(exc: ApiException) -> str:
    """The first line of the API's Status message (else its reason, else ``no message``)."""
    try:
        body = json.loads(exc.body or "")
        message = str(body.get("message") or exc.reason or "")
    except (ValueError, AttributeError):
        message = str(exc.reason or "")
    return message.strip().splitlines()[0] if message.strip() else "no message"
