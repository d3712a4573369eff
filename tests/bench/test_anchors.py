"""The llama.cpp anchors' lifetime: every model a benchmark opens is closed when its block ends, also when
the block fails or a later model fails to load (a fake stands for llama.cpp, which takes minutes to build)."""
import pytest

from minillm.bench import anchors

MODEL = "smollm2-135m-instruct"  # the packaged model: the only one with llama.cpp files


class FakeLlamaCpp:
    opened: list["FakeLlamaCpp"] = []

    def __init__(self, kind: str, threads: int, model: str) -> None:
        if kind == "broken":
            raise RuntimeError("llama.cpp could not load the file")
        self.kind, self.closed = kind, False
        FakeLlamaCpp.opened.append(self)

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def fake_llama_cpp(monkeypatch):
    FakeLlamaCpp.opened = []
    monkeypatch.setattr(anchors, "missing", lambda: None)
    monkeypatch.setattr(anchors, "LlamaCpp", FakeLlamaCpp)
    return FakeLlamaCpp.opened


def test_anchors_are_closed_when_the_benchmark_block_ends(fake_llama_cpp):
    with anchors.open_anchors(MODEL, ("F32", "Q8_0"), threads=2) as (models, reason):
        assert reason is None and list(models) == ["llama.cpp F32", "llama.cpp Q8_0"]
        assert not any(m.closed for m in models.values())
    assert [m.closed for m in fake_llama_cpp] == [True, True]


def test_anchors_are_closed_when_the_block_fails_or_a_later_one_fails_to_load(fake_llama_cpp):
    with pytest.raises(KeyboardInterrupt), anchors.open_anchors(MODEL, ("F32",), threads=2):
        raise KeyboardInterrupt
    with pytest.raises(RuntimeError, match="could not load"), anchors.open_anchors(MODEL, ("F32", "broken"), 2):
        pass
    assert [m.closed for m in fake_llama_cpp] == [True, True]


def test_no_anchors_for_a_model_without_llama_cpp_files(fake_llama_cpp):
    with anchors.open_anchors("tiny", ("F32",), threads=2) as (models, reason):
        assert models == {} and "'tiny'" in reason
    assert fake_llama_cpp == []
