"""What the Kubernetes backend makes of the API's failed answers: one-line tgnb errors whose
message is the sentence itself (a 404 printed as a tuple once), with the status kept."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from tgnb.backends.kubernetes.apierrors import api_error, status_message
from tgnb.errors import ApiError, AuthenticationError, BackendError, NotFoundError


def _exc(status: int, message: str | None, reason: str = "Reason") -> ApiException:
    exc = ApiException(status=status, reason=reason)
    exc.body = json.dumps({"kind": "Status", "message": message}) if message is not None else None
    return exc


def test_a_404_is_a_not_found_error_whose_message_is_one_sentence() -> None:
    error = api_error(_exc(404, 'jobs.batch "run-1" not found'), "read the Job 'run-1'")
    assert isinstance(error, NotFoundError) and isinstance(error, ApiError)
    assert str(error) == "could not read the Job 'run-1': jobs.batch \"run-1\" not found (404)"
    assert error.status_code == 404
    with pytest.raises(LookupError, match=r"^could not read the Job"):
        raise error


@pytest.mark.parametrize("status", [401, 403])
def test_a_refusal_names_the_permissions(status: int) -> None:
    error = api_error(_exc(status, "forbidden: User cannot get jobs"), "list jobs")
    assert isinstance(error, AuthenticationError) and error.status_code == status
    assert str(error).startswith(f"the Kubernetes API refused to list jobs ({status}: forbidden")
    assert "\n" not in str(error) and "kube_config" in str(error)


def test_another_status_and_an_unreachable_api_are_backend_errors() -> None:
    error = api_error(_exc(500, "etcd timeout\nsecond line"), "create the Job")
    assert type(error) is BackendError
    assert str(error) == "could not create the Job: the Kubernetes API answered 500: etcd timeout"
    down = api_error(ConnectionRefusedError("[Errno 111] Connection refused\nmore"), "list pods")
    assert type(down) is BackendError
    assert str(down) == (
        "could not reach the Kubernetes API to list pods: [Errno 111] Connection refused"
    )


def test_status_message_falls_back_to_the_reason() -> None:
    assert status_message(_exc(404, None, reason="Not Found")) == "Not Found"
    assert status_message(_exc(404, "", reason="")) == "no message"
