"""The Live engine page: tokens stream, charts fill, knobs change the engine, mistakes get messages."""
import time

import pytest
from app_pages import errors, figures, run_to_end

from minillm.testing import wait_until
from minillm_visualizer.shared.controls import REFRESH_S


def test_live_page_renders_before_any_run(app):
    assert not app.exception
    assert any("Run" in i.value for i in app.info)


def test_run_streams_tokens_and_fills_the_charts(app):
    run = run_to_end(app)
    assert run.status == "finished"
    table = app.dataframe[0].value
    assert len(table) == 8 and (table["output tokens"] > 0).all()
    assert table["text"].str.len().sum() > 0
    assert any(code.value.strip() for code in app.code)
    figs = figures(app)
    assert len(figs["Time to first token"]["data"][0]["y"]) == 8
    assert len(figs["Inter-token latency"]["data"][0]["x"]) > 0
    assert max(figs["Throughput"]["data"][0]["y"]) > 0
    block_map = next(f for t, f in figs.items() if t.startswith("KV pool"))
    assert block_map["data"][0]["z"]


def test_view_redraws_at_least_four_times_a_second_while_running(app):
    assert REFRESH_S <= 0.25
    app.session_state["k_pace_ms"] = 30
    app.button(key="b_run").click().run()
    first = app.metric[0].value
    time.sleep(0.6)
    app.run()
    assert int(app.metric[0].value) > int(first), "the step count should move while the run goes on"


def test_stop_ends_the_run_and_frees_every_block(app):
    app.session_state["k_pace_ms"] = 100
    app.button(key="b_run").click().run()
    run = app.session_state["run"]
    time.sleep(0.5)
    app.button(key="b_stop").click().run()
    assert run.status == "stopped"
    assert not run.engine.has_unfinished()
    assert run.final_kv.used_blocks == 0
    assert any(s.finish_reason == "abort" for s in run.samples.values())
    block_map = next(f for t, f in figures(app).items() if t.startswith("KV pool"))
    assert all(t == "" for row in block_map["data"][0]["text"] for t in row), "no block may have an owner left"


def test_pause_step_and_resume(app):
    app.session_state["k_pace_ms"] = 50
    app.button(key="b_run").click().run()
    run = app.session_state["run"]
    app.button(key="b_pause").click().run()
    time.sleep(0.2)  # a step in flight when Pause was pressed may still land
    paused_at = len(run.records)
    time.sleep(0.3)
    assert len(run.records) == paused_at
    app.button(key="b_step").click().run()
    assert wait_until(lambda: len(run.records) > paused_at, timeout=10)
    time.sleep(0.3)
    assert len(run.records) == paused_at + 1, "Step runs one step, and the run stays paused after it"
    app.button(key="b_resume").click().run()
    assert run.wait(60) and run.status == "finished"


def test_block_size_knob_changes_the_pool(app):
    small = run_to_end(app)
    app.session_state["k_block_size"] = 8
    big = run_to_end(app)
    assert big.final_kv.total_blocks == 2 * small.final_kv.total_blocks
    assert any(t == f"KV pool: {big.final_kv.total_blocks} blocks of 8 tokens" for t in figures(app))


def test_sequential_scheduler_runs_one_request_at_a_time(app):
    continuous = run_to_end(app)
    app.session_state["k_scheduler"] = "sequential"
    sequential = run_to_end(app)
    assert max(r.event.running for r in continuous.records) > 1
    assert max(r.event.running for r in sequential.records) == 1


@pytest.mark.parametrize("state, message", [
    ({"k_source": "My prompts", "k_prompts": "   \n"}, "prompt list is empty"),
    ({"k_kv_mib": 0.01}, "holds no block"),
    ({"k_block_size": 0}, "block_size must be a positive integer"),
], ids=["empty prompt list", "KV budget under one block", "block size 0"])
def test_invalid_input_gets_a_message_not_a_traceback(app, state, message):
    for key, value in state.items():
        app.session_state[key] = value
    app.run()
    app.button(key="b_run").click().run()
    assert not app.exception
    assert any(message in e for e in errors(app))


def test_a_request_too_long_for_the_context_is_refused_with_the_reason(app):
    app.session_state["k_source"] = "My prompts"
    app.session_state["k_max_tokens"] = 400
    app.session_state["k_prompts"] = "x = 1 " * 60
    app.run()
    app.button(key="b_run").click().run()
    assert not app.exception
    assert any("exceeds the context length" in e for e in errors(app))
