import pytest

from minillm.cli import main
from minillm.tune.command import seconds, size


def test_tune_help_names_its_inputs(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["tune", "--help"])
    assert exit.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--workload", "--objective", "--slo-ttft", "--space", "--memory-budget", "--tpot-budget",
                 "--price-per-hour", "--results"):
        assert flag in out


def test_sizes_and_times_read_their_units():
    assert size("300MB") == 300 * 10**6 and size("1.5GiB") == 3 * 2**29 and size("4096") == 4096
    assert seconds("50ms") == pytest.approx(0.05) and seconds("1.5s") == 1.5 and seconds("2") == 2.0


def error_of(capsys, argv) -> str:
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    return err


def test_an_unknown_knob_is_a_clear_error(capsys, tmp_path):
    err = error_of(capsys, ["tune", "--model", "tiny", "--space", "max_seqs=2,4", "--results", str(tmp_path / "t")])
    assert "error: unknown knob 'max_seqs': the knobs are max_num_seqs, max_num_batched_tokens" in err


def test_a_malformed_trace_line_is_a_clear_error(capsys, tmp_path):
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"arrival": 0, "prompt_tokens": 8, "output_tokens": 2}\n{"arrival": 1, "prompt": "hi"}\n')
    err = error_of(capsys, ["tune", "--model", "tiny", "--workload", str(trace), "--results", str(tmp_path / "t")])
    assert f"error: {trace}, line 2: " in err and "must be a JSON object with arrival, prompt_tokens" in err


def test_a_bad_size_names_the_units(capsys):
    with pytest.raises(SystemExit):
        main(["tune", "--memory-budget", "300XB"])
    assert "'300XB' is not a size: write bytes or a number with one of b, kb, mb" in capsys.readouterr().err


def test_a_budget_smaller_than_the_weights_exits_naming_them(capsys, tmp_path):
    err = error_of(capsys, ["tune", "--model", "tiny", "--memory-budget", "1MB", "--results", str(tmp_path / "t")])
    assert "error: the memory budget of 1.0 MB is smaller than the weights alone" in err


def test_an_edge_budget_nothing_fits_exits_1_naming_the_closest(capsys, tmp_path, profiles, one_thread):
    paths = []
    for scheme, profile in profiles.items():
        profile.save(tmp_path / f"{scheme}.json")
        paths.append(f"{scheme}={tmp_path / scheme}.json")
    rc = main(["tune", "--model", "tiny", "--memory-budget", "10MB", "--tpot-budget", "1ms", "--profile", *paths,
               "--results", str(tmp_path / "e.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "error: nothing fits: the closest, " in err and "the budget is 10.0 MB" in err


def test_serve_takes_every_knob_tune_recommends(monkeypatch):
    from minillm.serve import server
    seen = {}
    monkeypatch.setattr(server, "run_server", lambda *a, engine_options, **kw: seen.update(engine_options) or 0)
    assert main(["serve", "--model", "tiny", "--max-num-seqs", "8", "--max-num-batched-tokens", "256",
                 "--block-size", "32", "--num-kv-blocks", "512", "--no-prefix-caching", "--no-chunked-prefill",
                 "--quantization", "int8"]) == 0
    assert {k: seen[k] for k in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_kv_blocks",
                                 "enable_prefix_caching", "enable_chunked_prefill")} == {
        "max_num_seqs": 8, "max_num_batched_tokens": 256, "block_size": 32, "num_kv_blocks": 512,
        "enable_prefix_caching": False, "enable_chunked_prefill": False}
    assert seen["quantization"].scheme == "int8"
