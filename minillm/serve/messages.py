"""Chat messages as OpenAI's clients send them, reduced to what the chat template reads: a role and text.

`content` is a string, a list of parts, or null (an assistant turn that only called tools). Text
parts are joined in order; image, audio and file parts are refused, since the model reads text only.

    {"role": "user", "content": [{"type": "text", "text": "hello"}, {"type": "text", "text": " there"}]}
    -> {"role": "user", "content": "hello there"}
"""
from typing import Literal

from pydantic import BaseModel, ConfigDict, field_validator

NOT_TEXT = ("image_url", "input_image", "image", "input_audio", "audio", "file", "video_url")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None  # an assistant's earlier calls: the template renders only its text
    tool_call_id: str | None = None       # the call a tool message answers
    refusal: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_only(cls, content):
        """A part that is not text gets its own message (pydantic's would list every union member)."""
        if isinstance(content, list):
            for i, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind in NOT_TEXT:
                    raise ValueError(f"content part {i} has type {kind!r}: this model is text-only, so only "
                                     f"parts of type 'text' are accepted")
        return content

    def text(self) -> str:
        """The content as one string: parts joined in order, none (a tool-calling turn) as empty."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def for_template(self) -> dict:
        message = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        return message
