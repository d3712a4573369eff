"""The Scheduler timeline page: the Gantt of steps x requests, queues, token budget, the step cursor."""
from app_pages import figures, run_to_end

from minillm_visualizer.timeline.charts import STATES


def open_timeline(app):
    app.switch_page("minillm_visualizer/timeline/timeline.py").run()
    assert not app.exception


def codes(gantt) -> set[float]:
    return {z for row in gantt["data"][0]["z"] for z in row if z is not None}


def test_timeline_renders_before_any_run(app):
    open_timeline(app)
    assert any("Run" in i.value for i in app.info)


def test_run_draws_prefill_and_decode_for_every_request(app):
    open_timeline(app)
    run = run_to_end(app)
    figs = figures(app)
    gantt = figs["What each request did, step by step"]
    assert gantt["data"][0]["y"] == list(run.samples)
    assert {STATES["prefill"][0] + 0.5, STATES["decode"][0] + 0.5} <= codes(gantt)
    budget = figs["Token budget used per step"]
    cached = sum(s.metrics["cached_prompt_tokens"] for s in run.samples.values())
    assert sum(budget["data"][0]["y"]) + cached == sum(s.prompt_tokens for s in run.samples.values())
    assert any(shape.get("y0") == 256 for shape in budget["layout"]["shapes"]), "the budget line"
    assert max(figs["Queues"]["data"][1]["y"]) > 1


def test_a_small_kv_pool_shows_preemptions(app):
    open_timeline(app)
    app.session_state["k_kv_mib"] = 0.5  # 16 blocks of pico: not enough for 8 growing requests
    run = run_to_end(app)
    assert run.records[-1].event.num_preemptions > 0
    assert STATES["preempted"][0] + 0.5 in codes(figures(app)["What each request did, step by step"])


def test_token_budget_knob_caps_the_tokens_of_a_step(app):
    open_timeline(app)
    app.session_state["k_max_batched_tokens"] = 32
    run = run_to_end(app)
    assert max(sum(w.num_tokens for w in r.event.scheduled) for r in run.records) <= 32
    assert any(shape.get("y0") == 32 for shape in figures(app)["Token budget used per step"]["layout"]["shapes"])


def test_the_step_cursor_scrubs_to_an_earlier_step(app):
    open_timeline(app)
    run_to_end(app)
    app.toggle(key="timeline_cursor_follow").set_value(False).run()
    app.select_slider(key="timeline_cursor").set_value(1).run()
    assert not app.exception
    assert app.subheader[0].value.startswith("Step 1:")
    gantt = figures(app)["What each request did, step by step"]
    assert any(shape.get("x0") == 1 for shape in gantt["layout"]["shapes"]), "the cursor line sits on step 1"
    assert app.get("download_button")
