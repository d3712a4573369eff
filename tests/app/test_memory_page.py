"""The Paged memory explorer: block tables, prefix sharing, contiguous vs paged for the same requests."""
from app_pages import figures, run_to_end


def open_memory(app):
    app.switch_page("minillm_visualizer/memory/memory.py").run()
    assert not app.exception


def table(app, first_column: str):
    return next(df.value for df in app.dataframe if df.value.columns[0] == first_column)


def test_memory_page_renders_before_any_run(app):
    open_memory(app)
    assert any("Run" in i.value for i in app.info)


def test_block_tables_show_the_shared_prefix(app):
    open_memory(app)
    app.session_state["k_shared_prefix"] = 32  # two full blocks of 16, the same in every prompt
    run_to_end(app)
    tables = table(app, "sequence")
    assert len(tables) > 1
    assert (tables["shared blocks"] >= 2).any()
    assert len(table(app, "block")) >= 2, "the shared blocks are listed with who shares them"


def test_prefix_caching_off_shares_nothing(app):
    open_memory(app)
    app.session_state["k_prefix_caching"] = False
    run_to_end(app)
    assert (table(app, "sequence")["shared blocks"] == 0).all()


def test_contiguous_wastes_more_than_paged_for_the_same_requests(app):
    open_memory(app)
    run_to_end(app)
    rows = table(app, "allocation").set_index("allocation")["KV waste %"]
    paged = rows[[i for i in rows.index if i.startswith("paged, block 16")][0]]
    assert all(rows[i] > paged for i in rows.index if i.startswith("contiguous"))
    assert "Reserved KV memory holding no token (same requests)" in figures(app)


def test_a_contiguous_run_says_there_are_no_block_tables(app):
    open_memory(app)
    app.session_state["k_kv_cache"] = "contiguous"
    run_to_end(app)
    assert any("contiguous" in w.value for w in app.warning)
