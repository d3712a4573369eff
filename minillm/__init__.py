"""minillm: a compact, readable LLM inference engine for learning inference engineering."""
from minillm.config import EngineConfig
from minillm.llm import LLM
from minillm.outputs import RequestOutput, StreamChunk
from minillm.sampling import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "StreamChunk", "EngineConfig"]
__version__ = "0.1.0"
