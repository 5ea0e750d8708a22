"""Tool calling in OpenAI's shapes: the `tools` a chat request offers, its `tool_choice`, the
calls in a response's message (`tool_calls`) and in a stream's deltas. The models check the
shape; what the tools mean (unique names, a named tool offered, valid parameter schemas) is
the core's check (`specdec.serving.tool_spec`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionDefinition(BaseModel):
    """A function the model may call."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="letters, digits, '_' and '-', at most 64")
    description: str | None = Field(None, description="what it does (shown to the model)")
    parameters: dict[str, Any] | None = Field(
        None, description="the JSON schema of its arguments (an object schema); left out = no arguments")
    strict: bool | None = Field(
        None, description="accepted; arguments follow the schema exactly when tool_choice is required or named "
                          "(a grammar), and as the model writes them with auto")


class ChatTool(BaseModel):
    """One offered tool (only functions)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="one of the offered tools")


class NamedToolChoice(BaseModel):
    """tool_choice naming the function the model must call."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class FunctionCall(BaseModel):
    """The function a call invokes."""

    name: str
    arguments: str = Field(description="JSON text of an object")


class ToolCall(BaseModel):
    """A call the model made (a response message's `tool_calls`; also what a client sends back
    in an assistant message of the history)."""

    model_config = ConfigDict(extra="allow")

    id: str | None = Field(None, description="call_...: a tool message answers it by tool_call_id")
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(BaseModel):
    name: str | None = Field(None, description="in the call's first delta")
    arguments: str = Field(description="more of the arguments' JSON text (the deltas add up to it)")


class ToolCallDelta(BaseModel):
    """More of call `index` in a stream: its first delta has id, type and the function's name."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallDelta
