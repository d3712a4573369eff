"""minillm: a compact, readable LLM inference engine for learning inference engineering."""
from minillm.async_llm import AsyncLLM
from minillm.config import EngineConfig, SpeculativeConfig
from minillm.llm import LLM
from minillm.outputs import Completion, RequestOutput, StreamChunk
from minillm.quant.config import QuantConfig
from minillm.sampling import SamplingParams

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "Completion", "StreamChunk", "EngineConfig",
           "SpeculativeConfig", "QuantConfig"]
__version__ = "0.1.0"
