"""OpenAI's error object: the body of every 4xx / 5xx answer, and a stream's error event."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, rate_limit_error, service_unavailable_error, ...")
    param: str | None = Field(description="the field at fault, as the client named it (400 only)")
    code: str | None = Field(description="e.g. model_not_found, admission_limit, deadline_exceeded")


class ErrorResponse(BaseModel):
    error: ErrorDetail
