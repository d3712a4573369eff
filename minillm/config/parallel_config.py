"""ParallelConfig: how many processes share the model's layers."""
from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism (minillm/tp/). The flat knob is the field's name."""

    tensor_parallel_size: int = 1
    """Ranks sharing each layer's heads and MLP; more than 1 starts that many minus one worker processes."""

    def __post_init__(self) -> None:
        tp = self.tensor_parallel_size
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise ValueError(f"tensor_parallel_size must be an integer >= 1, got {tp!r}")
