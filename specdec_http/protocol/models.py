"""GET /v1/models: the served model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ModelSpeculation(BaseModel):
    """Extension: what a request may ask of speculation here."""

    proposers: list[str] = Field(description="the proposer names a request's speculation.proposer may pick")


class ModelCard(BaseModel):
    """The served model."""

    id: str
    object: Literal["model"]
    created: int = Field(description="when this server started (Unix seconds)")
    owned_by: str
    max_model_len: int | None = Field(description="the target's context in tokens (null while loading)")
    speculation: ModelSpeculation


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
