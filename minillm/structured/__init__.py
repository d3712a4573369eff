"""Structured output: constrain sampling so the text always matches a JSON schema, any JSON
object, a regular expression or an EBNF grammar.

A request asks with `SamplingParams(structured=StructuredOutput(json_schema=...))`. The engine
compiles the grammar once (xgrammar, the grammar engine vLLM and SGLang use), gives every sample
its own matcher, and before each draw masks the logits of the tokens the grammar forbids next:
the mask is a bitmask with one bit per vocabulary token (`mask.py`).
"""
from minillm.structured.mask import apply_grammar_mask
from minillm.structured.output_spec import StructuredOutput

__all__ = ["StructuredOutput", "apply_grammar_mask"]
