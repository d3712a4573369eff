"""Hardware profiles: peak compute and memory bandwidth, the two numbers a roofline needs.

Figures are the vendors' published peaks (dense, without structured sparsity); real kernels reach
some fraction of them. `measure.py` builds the same profile for the machine you are on.
"""
from dataclasses import dataclass

TERA = 1e12


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    peak_flops: dict[str, float]    # dtype -> FLOP/s (dense)
    bandwidth: float                # bytes/s from the memory the weights and KV cache live in
    memory_bytes: float             # capacity of that memory
    source: str                     # where the figures come from
    notes: str = ""

    def peak(self, dtype: str) -> float:
        """Peak FLOP/s for dtype; a profile without that dtype falls back to its nearest figure
        (16-bit formats share a peak, float32 falls back to the 16-bit one and vice versa)."""
        for name in (dtype, "bfloat16" if dtype == "float16" else "float16", "bfloat16", "float32"):
            if name in self.peak_flops:
                return self.peak_flops[name]
        raise ValueError(f"{self.name} has no peak FLOP/s figure (has {', '.join(self.peak_flops)})")

    @property
    def ridge(self) -> dict[str, float]:
        """Arithmetic intensity (FLOP/byte) where the roof turns from memory- to compute-bound."""
        return {dtype: flops / self.bandwidth for dtype, flops in self.peak_flops.items()}


PROFILES: dict[str, HardwareProfile] = {p.name: p for p in [
    HardwareProfile(
        "A100 SXM 80GB", {"float32": 19.5 * TERA, "bfloat16": 312 * TERA, "float16": 312 * TERA},
        2.039e12, 80e9, "NVIDIA A100 datasheet: FP32 19.5 TFLOPS, BF16/FP16 Tensor Core 312 TFLOPS dense, "
        "HBM2e 2,039 GB/s"),
    HardwareProfile(
        "H100 SXM", {"float32": 67 * TERA, "bfloat16": 989 * TERA, "float16": 989 * TERA},
        3.35e12, 80e9, "NVIDIA H100 datasheet: FP32 67 TFLOPS, BF16/FP16 Tensor Core 989 TFLOPS dense "
        "(1,979 with sparsity), HBM3 3.35 TB/s"),
    HardwareProfile(
        "H200 SXM", {"float32": 67 * TERA, "bfloat16": 989 * TERA, "float16": 989 * TERA},
        4.8e12, 141e9, "NVIDIA H200 datasheet: the H100's compute (BF16 989 TFLOPS dense), HBM3e 4.8 TB/s, 141 GB"),
    HardwareProfile(
        "Groq LPU (SRAM)", {"float16": 188 * TERA, "int8": 750 * TERA},
        80e12, 230e6, "Groq GroqChip product brief: 188 TFLOPS FP16, 750 TOPS INT8, 230 MB on-die SRAM "
        "at 80 TB/s",
        notes="SRAM-based: weights stay on chip, so bandwidth is ~20x HBM's, but one chip holds only "
              "230 MB: a model is spread over many chips (the profile is one chip)."),
]}
