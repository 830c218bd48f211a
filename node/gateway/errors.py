"""Errors the gateway answers, in OpenAI's shape.

    PlanetError
    └── ApiError                 .http_status, .error_type, .param, .code (all in the body)
        ├── InvalidRequest       400 invalid_request_error (a request field broke a rule)
        ├── Unauthorized         401 authentication_error (personal client: no or wrong token)
        ├── PaymentRequired      402 payment_required (unpaid, underfunded, squatted, used)
        ├── Forbidden            403 permission_error (personal client: foreign Host, Origin)
        ├── NotFound             404 not_found_error (model, receipt, route)
        ├── UnsupportedMediaType 415 invalid_request_error (a body that is not application/json)
        ├── NoCircuit            503 service_unavailable (a shard has no routable node)
        └── NodeFailed           502 bad_gateway (a node failed during the question)

Body: `{"error": {"message", "type", "param", "code"}}` — what the official clients parse.
Other PlanetErrors are mapped by their own `http_status` (see `error_body`).
"""

from __future__ import annotations

from typing import Any

from protocol.errors import PlanetError


class ApiError(PlanetError):
    error_type: str = "api_error"

    def __init__(
        self, code: str, message: str, *, param: str | None = None, hint: str | None = None
    ) -> None:
        super().__init__(message, code=code, hint=hint)
        self.param = param


class InvalidRequest(ApiError):
    http_status = 400
    error_type = "invalid_request_error"


class PaymentRequired(ApiError):
    http_status = 402
    error_type = "payment_required"


class Unauthorized(ApiError):
    http_status = 401
    error_type = "authentication_error"


class Forbidden(ApiError):
    http_status = 403
    error_type = "permission_error"


class UnsupportedMediaType(ApiError):
    http_status = 415
    error_type = "invalid_request_error"


class NotFound(ApiError):
    http_status = 404
    error_type = "not_found_error"


class NoCircuit(ApiError):
    http_status = 503
    error_type = "service_unavailable"


class NodeFailed(ApiError):
    http_status = 502
    error_type = "bad_gateway"


_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "payment_required",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    503: "service_unavailable",
}


def error_body(
    status: int, code: str, message: str, *, param: str | None = None, error_type: str = ""
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": error_type or _TYPE_BY_STATUS.get(status, "server_error"),
            "param": param,
            "code": code,
        }
    }


def planet_error_body(error: PlanetError) -> tuple[int, dict[str, Any]]:
    """(status, body) for any PlanetError."""
    if isinstance(error, ApiError):
        return error.http_status, error_body(
            error.http_status,
            error.code,
            error.message,
            param=error.param,
            error_type=error.error_type,
        )
    status = error.http_status if 400 <= error.http_status < 600 else 500
    return status, error_body(status, error.code, error.message)
