"""The Roofline page: profiles, predicted prefill and decode points, the measured engine point."""
import pytest
from app_pages import errors, figures


def open_roofline(app):
    app.switch_page("minillm_visualizer/roofline/roofline.py").run()
    assert not app.exception


def roofline(app) -> dict:
    return next(f for t, f in figures(app).items() if t.startswith("Roofline of"))


def test_every_hardware_profile_renders(app):
    open_roofline(app)
    for hw in app.selectbox(key="roof_hw").options:
        app.selectbox(key="roof_hw").set_value(hw).run()
        assert not app.exception
        names = [trace["name"] for trace in roofline(app)["data"]]
        assert names[0].startswith("roof") and "prefill, predicted" in names and "decode, predicted" in names


def test_decode_is_memory_bound_and_prefill_compute_bound_on_an_h100(app):
    open_roofline(app)
    app.selectbox(key="roof_hw").set_value("H100 SXM").run()
    app.selectbox(key="roof_model").set_value("Llama-3.1-8B").run()
    app.selectbox(key="roof_dtype").set_value("bfloat16").run()
    app.number_input(key="roof_context").set_value(1024).run()
    bounds = app.dataframe[0].value.set_index("operation")["bound"]
    assert bounds["decode (predicted)"] == "memory" and bounds["prefill (predicted)"] == "compute"


def test_batch_knob_moves_the_decode_point_right(app):
    open_roofline(app)
    app.selectbox(key="roof_hw").set_value("H100 SXM").run()
    app.selectbox(key="roof_model").set_value("Llama-3.1-8B").run()
    before = next(t for t in roofline(app)["data"] if t["name"] == "decode, predicted")["x"][0]
    app.number_input(key="roof_batch").set_value(64).run()
    after = next(t for t in roofline(app)["data"] if t["name"] == "decode, predicted")["x"][0]
    assert after > 4 * before


def test_measuring_the_engine_puts_it_beside_the_prediction(app):
    open_roofline(app)
    app.selectbox(key="roof_model").set_value("pico").run()
    app.number_input(key="roof_batch").set_value(4).run()
    app.number_input(key="roof_context").set_value(64).run()
    app.button(key="b_measure").click().run()
    assert not app.exception
    names = [t["name"] for t in roofline(app)["data"]]
    assert "prefill, measured" in names and "decode, measured" in names
    ops = list(app.dataframe[0].value["operation"])
    assert "decode (measured, engine)" in ops


def test_invalid_batch_and_context_get_messages(app):
    open_roofline(app)
    app.number_input(key="roof_batch").set_value(0).run()
    assert not app.exception and any("at least 1" in e for e in errors(app))
    app.number_input(key="roof_batch").set_value(8).run()
    app.selectbox(key="roof_model").set_value("pico").run()
    app.number_input(key="roof_context").set_value(4096).run()
    assert not app.exception and any("at most 512 tokens" in e for e in errors(app))


def test_the_ridge_label_sits_on_the_ridge_line_of_a_log_axis():
    """On a log axis plotly reads an annotation's x as log10 of the value (a shape's x as the value):
    a label given the raw value would land at 10^ridge and stretch the axis past every point."""
    import math

    from minillm.perf import PROFILES
    from minillm_visualizer.shared.roofline_chart import roofline_chart
    for hw in PROFILES.values():
        fig = roofline_chart(hw, "bfloat16", []).to_dict()
        ridge = hw.peak("bfloat16") / hw.bandwidth
        (line,), (label,) = fig["layout"]["shapes"], fig["layout"]["annotations"]
        assert line["x0"] == pytest.approx(ridge)
        assert label["x"] == pytest.approx(math.log10(ridge)), f"{hw.name}: the ridge label is not at the line"
