"""llama.cpp beside minillm: the program a CPU user would run instead, on the same model.

llama.cpp's Python binding (`llama-cpp-python`, installed by `make anchors`: it compiles llama.cpp,
minutes on two cores) runs SmolLM2-135M-Instruct from the package's own Q4_1 file, and from F32 and
Q8_0 files written here with the `gguf` package from that one: every tensor dequantized (F32) or
re-quantized to Q8_0, every metadata field (architecture, tokenizer, chat template) copied as is. So
all three hold the weights minillm loads (Q4_1 dequantized), and F32 streams the same bytes per token
as minillm's float32 decode. The files are written once, under ~/.cache/minillm/anchors/.

Benchmarks import this module lazily and, when the binding is missing, print `missing()`'s reason
instead of the llama.cpp rows.
"""
import contextlib
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from minillm.models.registry import PACKAGED_MODELS, packaged_gguf

CACHE = Path.home() / ".cache" / "minillm" / "anchors"
KINDS = ("F32", "Q8_0", "Q4_1")  # Q4_1 is the package's own file
INSTALL = "make anchors (pip install llama-cpp-python: it compiles llama.cpp, minutes on two cores)"


def missing() -> str | None:
    """Why llama.cpp cannot run here, or None when it can."""
    if importlib.util.find_spec("llama_cpp") is None:
        return f"llama.cpp is not installed: {INSTALL}"
    return None


def gguf_file(kind: str, model: str = "smollm2-135m-instruct") -> Path:
    """The model as a GGUF file of `kind` (F32, Q8_0 or Q4_1), written on first use."""
    if kind not in KINDS:
        raise ValueError(f"llama.cpp anchors run {', '.join(KINDS)}, got {kind!r}")
    source = packaged_gguf(model)
    if source is None:
        raise FileNotFoundError(f"{model!r}'s package is not installed: {PACKAGED_MODELS[model].install_command()}")
    if kind == "Q4_1":
        return source
    target = CACHE / f"{source.stem.rsplit('.', 1)[0]}.{kind}.gguf"
    if not target.is_file():
        rewrite(source, target, kind)
    return target


def rewrite(source: Path, target: Path, kind: str) -> None:
    """Write `source`'s tensors as F32 or Q8_0 into `target`, with all of its metadata."""
    import gguf
    reader = gguf.GGUFReader(source)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(target.with_suffix(".part"), arch)
    for field in reader.fields.values():
        # The writer adds the architecture and the header fields itself; the file type changes.
        if field.name.startswith("GGUF.") or field.name in (gguf.Keys.General.ARCHITECTURE,
                                                             gguf.Keys.General.FILE_TYPE):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if kind == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    for tensor in reader.tensors:
        shape = [int(n) for n in reversed(tensor.shape)]  # gguf lists dimensions innermost first
        weights = gguf.dequantize(tensor.data, tensor.tensor_type).reshape(shape).astype(np.float32)
        # Norm gains and other vectors stay F32 in llama.cpp's own Q8_0 files, and so here.
        if kind == "Q8_0" and weights.ndim == 2 and weights.shape[-1] % 32 == 0:
            data, qtype = gguf.quantize(weights, gguf.GGMLQuantizationType.Q8_0), gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(tensor.name, data, raw_shape=data.shape, raw_dtype=qtype)
        else:
            writer.add_tensor(tensor.name, weights)
    CACHE.mkdir(parents=True, exist_ok=True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    target.with_suffix(".part").rename(target)


class LlamaCpp:
    """One llama.cpp model with a context of `n_ctx` tokens, run on `threads` threads."""

    def __init__(self, kind: str, threads: int, n_ctx: int = 1024, model: str = "smollm2-135m-instruct") -> None:
        from llama_cpp import Llama
        self.kind = kind
        self.llm = Llama(model_path=str(gguf_file(kind, model)), n_ctx=n_ctx, n_threads=threads,
                         n_threads_batch=threads, n_batch=512, verbose=False)

    def decode(self, prompt: list[int], new: int) -> tuple[float, list[int]]:
        """Greedy: the prompt in one batch, then `new` tokens one at a time.
        -> (decode tokens/s after the first token, as 1 / TPOT, the new tokens)"""
        llm = self.llm
        llm.reset()
        llm.eval(prompt)
        tokens, start = [], None
        for i in range(new):
            tokens.append(int(np.argmax(self.last_logits())))
            if i == 0:
                start = time.perf_counter()  # like minillm's TPOT: the time after the first token
            if i < new - 1:
                llm.eval([tokens[-1]])
        return (new - 1) / (time.perf_counter() - start), tokens

    def last_logits(self) -> np.ndarray:
        """The logits after the last token evaluated: [vocab] (a view of llama.cpp's buffer). The binding
        keeps its own copy (`scores`) only when built to keep every position's logits."""
        import llama_cpp
        pointer = llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return np.ctypeslib.as_array(pointer, shape=(self.llm.n_vocab(),))

    def close(self) -> None:
        self.llm.close()


@contextlib.contextmanager
def open_anchors(model: str, kinds: tuple[str, ...], threads: int) -> Iterator[tuple[dict[str, LlamaCpp], str | None]]:
    """llama.cpp models of `kinds` for a benchmark of `model` -> ({row name: model}, why none, or None), each
    closed when the block ends. (A Llama left to its __del__ until interpreter exit prints "Exception ignored in:
    <function Llama.__del__ ...>": the binding's module globals are gone by then.) Only the packaged SmolLM2
    has llama.cpp files here."""
    if model not in PACKAGED_MODELS:
        yield {}, f"llama.cpp rows need a packaged real model ({', '.join(PACKAGED_MODELS)}), not {model!r}"
        return
    reason = missing()
    if reason is not None:
        yield {}, reason
        return
    anchors = {}
    try:
        for kind in kinds:
            anchors[f"llama.cpp {kind}"] = LlamaCpp(kind, threads, model=model)
        yield anchors, None
    finally:
        for anchor in anchors.values():
            anchor.close()
