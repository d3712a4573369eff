"""A model's chat template: a list of messages -> the one prompt string the model continues.

As Hugging Face `transformers` and vLLM do, the template is Jinja2 and comes with the model: the
`chat_template` of `tokenizer_config.json` in the model's folder (a string, or a list of named
templates of which "default" is used; the GGUF loader writes it there from the file's metadata). It
sees `messages` (dicts with `role` and `content`), `add_generation_prompt`, `bos_token`, `eos_token`
and `raise_exception(message)`, and runs in Jinja2's sandbox, since a downloaded template is code
from someone else.

    template = ChatTemplate.for_model(model_dir)
    template.render([{"role": "user", "content": "Hi!"}])
    # SmolLM2: "<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, ...<|im_end|>\\n"
    #          "<|im_start|>user\\nHi!<|im_end|>\\n<|im_start|>assistant\\n"

The bundled models (pico, tiny) are small code models trained on Python, NOT instruction-tuned:
they ship no template, and DEFAULT_TEMPLATE below just writes each turn as `role: content` lines
and ends with `assistant:`. They will continue that text, not follow instructions; chat exists on
them so that chat clients and structured output can be exercised without a download.
"""
import json
from pathlib import Path

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
ROLES = ("system", "user", "assistant", "developer", "tool")  # OpenAI's roles (the server accepts the same)


def _raise(message: str):
    raise TemplateError(message)


def check_messages(messages: list[dict]) -> None:
    """A conversation is a non-empty list of {"role": one of ROLES, "content": text} dicts (other keys,
    such as "name", may be there too); anything else raises ValueError naming the message at fault."""
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, got "
                         f"{messages!r}")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {message!r}")
        missing = [key for key in ("role", "content") if key not in message]
        if missing:
            raise ValueError(f"messages[{i}] has no {' and no '.join(repr(k) for k in missing)}: {message!r}")
        if message["role"] not in ROLES:
            raise ValueError(f"messages[{i}] has role {message['role']!r}; a role is one of {', '.join(ROLES)}")
        if not isinstance(message["content"], str):
            raise ValueError(f"messages[{i}]'s content must be text, got {type(message['content']).__name__}: "
                             f"{message['content']!r}")


class ChatTemplate:
    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self.source = source
        self.template = env.from_string(source)
        self.bos_token, self.eos_token = bos_token, eos_token

    @classmethod
    def for_model(cls, model_dir: Path) -> "ChatTemplate":
        """The model's own template from tokenizer_config.json when it has one, else DEFAULT_TEMPLATE."""
        path = Path(model_dir) / "tokenizer_config.json"
        config = json.loads(path.read_text()) if path.exists() else {}
        source = config.get("chat_template") or DEFAULT_TEMPLATE
        if isinstance(source, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
            named = {t["name"]: t["template"] for t in source}
            source = named.get("default") or next(iter(named.values()))
        return cls(source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token")))

    @property
    def is_default(self) -> bool:
        """True when the model brought no template of its own (the bundled models)."""
        return self.source == DEFAULT_TEMPLATE

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """messages: [{"role": ..., "content": ...}] -> the prompt; with add_generation_prompt, it ends
        where the assistant's answer begins. Malformed messages (check_messages), or a conversation the
        template refuses (say, roles that do not alternate), raise ValueError with the reason."""
        check_messages(messages)
        try:
            return self.template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                        bos_token=self.bos_token, eos_token=self.eos_token)
        except TemplateError as e:
            raise ValueError(f"the chat template refused these messages: {e}") from None


def _token_text(token) -> str:
    """tokenizer_config.json writes special tokens as text or as {"content": text, ...}."""
    if isinstance(token, dict):
        return token.get("content", "")
    return token or ""
