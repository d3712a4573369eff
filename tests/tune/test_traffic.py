import pytest

from minillm.tune.traffic import TraceError, first_requests, named_workload, read_trace


def test_a_trace_is_read_one_line_at_a_time(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 2}\n\n'
                    '{"arrival": 0.5, "prompt_tokens": 9, "output_tokens": 3}\nnot json\n')
    lines = read_trace(path)
    assert next(lines).prompt_tokens == 8 and next(lines).arrival == 0.5  # the bad line is not read yet
    with pytest.raises(TraceError, match=r"line 4: 'not json' is not a request: each line must be a JSON object "
                                         r"with arrival, prompt_tokens, output_tokens"):
        next(lines)
    assert len(first_requests(str(path), 2, 1.0)) == 2


def test_a_trace_line_with_bad_values_names_what_is_accepted(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival": 1, "prompt_tokens": 8, "output_tokens": 2}\n'
                    '{"arrival": 0.5, "prompt_tokens": 8, "output_tokens": 2}\n')
    with pytest.raises(TraceError, match=r"line 2: .*arrival must be seconds >= the line before's \(1.0\)"):
        list(read_trace(path))


def test_named_workloads_are_seeded_and_an_unknown_one_is_named():
    assert [r.arrival for r in named_workload("chat", 4, 2.0)] == [r.arrival for r in named_workload("chat", 4, 2.0)]
    assert all(r.arrival == 0 for r in named_workload("batch", 4, 2.0))
    with pytest.raises(ValueError, match="unknown workload 'code': the workloads are chat, batch"):
        named_workload("code", 4, 1.0)
