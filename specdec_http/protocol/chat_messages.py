"""A chat request's messages, as OpenAI sends them: a role and content that is a string or a
list of content parts. The models check the shape; which roles and parts this server can
render is the core's check (`specdec.serving.chat_template.check_messages`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from specdec_http.protocol.tools import ToolCall


class ContentPart(BaseModel):
    """One part of a message's content (only {"type": "text", "text"} parts are rendered)."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="the part's kind: only 'text' is supported")
    text: str | None = Field(None, description="the text of a 'text' part")


class ChatMessage(BaseModel):
    """One message of the conversation (other OpenAI message fields, e.g. `name`, are accepted
    and not rendered)."""

    model_config = ConfigDict(extra="allow")

    role: str = Field(description="system, user, assistant, developer or tool")
    content: str | list[ContentPart] | None = Field(
        None, description="the text, or text parts (joined with newlines, as vLLM does)")
    tool_calls: list[ToolCall] | None = Field(None, description="an assistant message's calls (content may be null)")
    tool_call_id: str | None = Field(None, description="a tool message: the id of the call it answers")
