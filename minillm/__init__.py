"""minillm: a compact, readable LLM inference engine for learning inference engineering."""
from minillm.kernels.mode import choose_triton_mode

choose_triton_mode()  # before anything imports triton (transformers may): kernels/mode.py says why

from minillm.async_llm import AsyncLLM  # noqa: E402
from minillm.config import EngineConfig, SpeculativeConfig  # noqa: E402
from minillm.llm import LLM  # noqa: E402
from minillm.outputs import Completion, RequestOutput, StreamChunk  # noqa: E402
from minillm.quant.quant_config import QuantConfig  # noqa: E402
from minillm.sampling import SamplingParams  # noqa: E402

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "Completion", "StreamChunk", "EngineConfig",
           "SpeculativeConfig", "QuantConfig"]
__version__ = "0.1.0"
