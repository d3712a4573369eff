"""The Kernels page: each kernel run in Triton's interpreter with its loads and stores recorded, the recorded
map checked against what the kernel must touch, its error against the spec shown, and the attention backend
switch reaching the live engine. Small sizes: the interpreter runs one program after another."""
import pytest
import torch
from app_pages import APP, errors, figures

from minillm.kernels.runtime import tl, triton
from minillm_visualizer.kernels.cases import KNOBS, context_lens, defaults, run_case
from minillm_visualizer.kernels.charts import walk
from minillm_visualizer.kernels.trace import record


@pytest.fixture
def kernels():
    from streamlit.testing.v1 import AppTest
    at = AppTest.from_file(str(APP), default_timeout=120)
    at.switch_page("minillm_visualizer/kernels/kernels.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def hover(at, title_start: str) -> list[str]:
    """The hover texts of a buffer's figure, one per element."""
    fig = next(f for t, f in figures(at).items() if t.startswith(title_start))
    return [cell for row in fig["data"][0]["text"] for cell in row]


def test_the_default_page_records_vector_add_and_checks_it_against_its_spec(kernels):
    assert kernels.title[0].value == "Kernels" and not errors(kernels)
    shown = metrics(kernels)
    assert shown == {"Programs": "3", "Max abs error": "0.0e+00", "Outputs stored exactly once": "yes",
                     "Accesses outside the buffers": "0"}
    titles = list(figures(kernels))
    assert titles[0] == "Grid: 3 programs of vector_add_kernel"
    assert set(titles[1:]) == {"x_ptr: [10] float32, loaded", "y_ptr: [10] float32, loaded",
                               "out_ptr: [10] float32, stored"}
    cells = hover(kernels, "out_ptr")
    assert cells[0] == "out_ptr[0] · program (0) · loads 0, stores 1"
    assert cells[9] == "out_ptr[9] · program (2) · loads 0, stores 1", "n = 10 in blocks of 4: the third program"
    assert any("These figures need a GPU" in i.value for i in kernels.info), "no CPU timings shown as figures"


@pytest.mark.parametrize("kernel", list(KNOBS))
def test_every_output_element_is_stored_exactly_once_and_nothing_strays(kernel):
    case = run_case(kernel, defaults(kernel))
    launch = case.launch
    assert case.error < 1e-5, f"{kernel} against {case.reference}: {case.error}"
    assert not launch.strays(), "no address outside the kernel's buffers"
    for name in case.outputs:
        assert (launch.counts(name, "store") == 1).all()
    assert all(a.index.min() >= 0 and a.index.max() < launch.buffers[a.buffer].span for a in launch.accesses)


def test_vector_add_masks_the_last_block():
    launch = run_case("vector add", {"n": 10, "block": 4}).launch
    assert launch.grid == (3, 1, 1)
    assert launch.footprint("x_ptr", 2).tolist() == [8, 9], "the last program's lanes 10 and 11 are masked off"
    assert (launch.counts("x_ptr", "load") == 1).all() and (launch.counts("out_ptr", "load") == 0).all()


def test_matmul_programs_read_bands_and_write_their_tile():
    v = {"m": 33, "n": 20, "k": 40, "block_m": 16, "block_n": 16, "block_k": 16}
    launch = run_case("matmul", v).launch
    assert launch.grid == (3, 2, 1)
    program = 1 * 2 + 1  # program (1, 1): rows 16-31, columns 16-19 of c
    expected = [r * 20 + c for r in range(16, 32) for c in range(16, 20)]
    assert launch.footprint("c_ptr", program, "store").tolist() == expected
    assert launch.footprint("a_ptr", program).tolist() == [r * 40 + k for r in range(16, 32) for k in range(40)]
    assert (launch.counts("a_ptr", "load") == 2).all(), "each band of a is read by both programs of its grid row"
    assert (launch.counts("b_ptr", "load") == 3).all(), "each band of b by the three programs of its grid column"


def test_online_softmax_reads_each_element_twice():
    one = run_case("softmax", {"rows": 2, "cols": 20, "block": 32}).launch
    online = run_case("softmax", {"rows": 2, "cols": 20, "block": 8}).launch
    assert (one.counts("x_ptr", "load") == 1).all() and (online.counts("x_ptr", "load") == 2).all()


def test_paged_decode_programs_walk_their_block_tables():
    v = {"seqs": 3, "longest": 70, "block_size": 8, "heads": 4, "kv_heads": 2, "d": 8}
    case = run_case("paged decode attention", v)
    launch, tables = case.launch, case.tables
    assert case.lens == context_lens(3, 70) == [70, 35, 9] and launch.grid == (3, 2, 1)
    for b, length in enumerate(case.lens):
        slots = [int(tables[b, t // 8]) * 8 + t % 8 for t in range(length)]
        for kvh in range(2):
            program = b * 2 + kvh
            steps = walk(launch, program)
            assert [s for _, tile in steps for s in tile] == slots, "token t read from its block table's slot"
            assert len(steps) == -(-length // 64), "one loop step per 64-token tile"
            assert launch.footprint("k_ptr", program).tolist() == sorted(s * 16 + kvh * 8 + c for s in slots
                                                                         for c in range(8))
    counts = launch.counts("k_ptr", "load")
    assert set(counts.tolist()) == {0, 1} and counts.sum() == sum(case.lens) * 2 * 8, \
        "each key of the context read once; the free slots at the end of a last block never"


def test_the_recorder_catches_a_missing_mask():
    @triton.jit
    def unmasked_copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets))

    x, out = torch.arange(6.0), torch.zeros(6)
    buffer = torch.zeros(64)  # the kernel's strays land in here, not in memory it does not own
    x, out = buffer[8:14].copy_(x), buffer[40:46]
    _, [launch] = record(lambda: unmasked_copy[(2,)](x, out, BLOCK=4))
    strays = launch.strays()
    assert {a.kind for a in strays} == {"load", "store"} and sum(a.index.size for a in strays) == 4


def test_switching_kernel_and_sizes_redraws_the_map(kernels):
    kernels.radio(key="k_kern_kernel").set_value("matmul").run()
    kernels.number_input(key="k_kern_matmul_n").set_value(40).run()
    assert not kernels.exception and not errors(kernels)
    assert list(figures(kernels))[0] == "Grid: 9 programs of matmul_kernel"
    assert all(cell.endswith("loads 3, stores 0") for cell in hover(kernels, "a_ptr")), "3 column tiles read a"
    assert metrics(kernels)["Outputs stored exactly once"] == "yes"
    error = run_case("matmul", {**defaults("matmul"), "n": 40}).error
    assert metrics(kernels)["Max abs error"] == f"{error:.1e}" and error < 1e-4
    kernels.radio(key="k_kern_kernel").set_value("paged decode attention").run()
    kernels.selectbox(key="k_kern_follow").set_value(3).run()
    assert "How program (1, 1) walks the pool: token → slot" in figures(kernels)


def test_sizes_the_kernel_cannot_take_get_a_message(kernels):
    kernels.radio(key="k_kern_kernel").set_value("int4 matmul").run()
    kernels.number_input(key="k_kern_int4_matmul_k").set_value(40).run()
    assert not kernels.exception and not figures(kernels)
    assert errors(kernels)[0].startswith("Cannot run the kernel: the int4 format packs two codes a byte and whole "
                                         "groups a row: Inputs K must be even and a multiple of the group size, got "
                                         "K = 40 and groups of 16")


def test_the_backend_switch_reaches_the_live_engine(app, monkeypatch):
    from minillm.cache import paged_triton
    calls = []
    real = paged_triton.TritonPagedContext.attend
    monkeypatch.setattr(paged_triton.TritonPagedContext, "attend",
                        lambda self, *a: calls.append(a[0]) or real(self, *a))
    for key, value in {"k_source": "My prompts", "k_prompts": "def add(a, b):", "k_max_tokens": 4}.items():
        app.session_state[key] = value
    app.switch_page("minillm_visualizer/kernels/kernels.py").run()
    app.radio(key="k_attention_backend").set_value("triton").run()
    app.switch_page("minillm_visualizer/live/live.py").run()
    assert app.radio(key="k_attention_backend").value == "triton", "the sidebar shows the page's choice"
    assert any("Triton's interpreter" in c.value for c in app.caption)
    app.button(key="b_run").click().run()
    run = app.session_state["run"]
    assert run.wait(120) and run.status == "finished", run.error
    backend = run.engine.config.kernels.attention_backend
    assert backend == "triton" and calls, "attention went through the Triton kernels"
