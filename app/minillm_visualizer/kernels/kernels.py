"""Kernels: the engine's Triton kernels, what each program of the grid loads and stores, checked against
their PyTorch specs; the switch that puts the live engine's attention on them."""
import streamlit as st
import torch

from minillm.kernels.runtime import INTERPRETED
from minillm_visualizer.kernels.cases import KNOBS, check, run_case
from minillm_visualizer.kernels.charts import buffer_map, grid_chart, label, walk_chart
from minillm_visualizer.shared.roofline_chart import roofline_chart

NOTES = {
    "vector add": "Program p adds elements p·BLOCK to p·BLOCK + BLOCK − 1. The last block sticks out past the end: "
                  "its mask keeps those lanes from loading or storing.",
    "RMSNorm": "One program per row: it reads the row of x and of the residual once, and writes both the new "
               "residual h and the normalised row y once. Every program reads the whole gain vector w.",
    "softmax": "One program per row. A row longer than BLOCK is read in blocks, twice (running max and sum, then "
               "the output): the loads count 2 per element.",
    "matmul": "Program (i, j) computes one BLOCK_M x BLOCK_N tile of c, walking K in steps of BLOCK_K: it reads a "
              "band of rows of a and a band of columns of b. Every program of a grid row reads the same band of a: "
              "that reuse is what a bigger tile buys.",
    "int4 matmul": "Like the matmul, with w read as packed 4-bit codes (two a byte: each byte is loaded for both its "
                   "nibbles) plus a scale and a zero point per group, dequantized in registers.",
    "paged decode attention": "Program (b, h) serves sequence b's query heads of KV head h: it reads b's block "
                              "table, then the keys and values of h at each slot its blocks hold, wherever they lie "
                              "in the pool. Follow a program to see its blocks light up.",
}

st.title("Kernels")
st.markdown("A kernel runs as a grid of programs; each program loads a few blocks of its inputs, computes, and "
            "stores its share of the output. Pick one of the engine's Triton kernels and its sizes: it runs here, "
            "every load and store is recorded, and each buffer is drawn element by element, coloured by the "
            "program that touched it.")
st.caption(":material/menu_book: Taught in **lab 07, Triton kernels**: `labs/lab07_kernels.ipynb` (open the labs "
           "with `make lab`). The engine's kernels are in `minillm/kernels/`, each beside the PyTorch spec it must "
           "match; `python -m minillm.bench kernels` measures them on a GPU.")

st.subheader("The live engine's attention backend")
st.session_state.setdefault("k_attention_backend", "torch")
st.radio("Attention backend", ["torch", "triton"], key="k_attention_backend", horizontal=True,
         help="torch: PyTorch's attention over K/V gathered from the blocks. triton: store-KV, paged decode and "
              "prefill kernels reading K/V in place in the paged pool. It applies at the next Run.")
if INTERPRETED:
    st.caption(":material/info: No GPU here, so the Triton kernels run in Triton's interpreter, one program after "
               "another on the CPU: the same tokens as torch, but much slower. The backend applies at the next "
               "**Run** on the run pages, with the paged KV cache.")
else:
    st.caption("The backend applies at the next **Run** on the run pages, with the paged KV cache.")

st.subheader("What each program touches")
kernel = st.radio("Kernel", list(KNOBS), key="k_kern_kernel", horizontal=True)
values = {}
cols = st.columns(len(KNOBS[kernel]))
for col, knob in zip(cols, KNOBS[kernel]):
    key = f"k_kern_{kernel.replace(' ', '_')}_{knob.name}"
    st.session_state.setdefault(key, knob.default)
    if knob.choices:
        values[knob.name] = col.select_slider(knob.label, knob.choices, key=key, help=knob.help or None)
    else:
        values[knob.name] = int(col.number_input(knob.label, knob.low, knob.high, key=key, help=knob.help or None))


@st.cache_data(max_entries=32, show_spinner="Running the kernel in Triton's interpreter...")
def recorded(kernel: str, values: dict):
    return run_case(kernel, values)


try:
    check(kernel, values)
    case = recorded(kernel, values)
except (ValueError, RuntimeError) as exc:
    st.error(f"Cannot run the kernel: {exc}", icon=":material/error:")
    st.stop()

launch = case.launch
once = all((launch.counts(name, "store") == 1).all() for name in case.outputs)
m = st.columns(4)
m[0].metric("Programs", launch.programs, help=f"The grid {' x '.join(map(str, launch.grid))}.")
m[1].metric("Max abs error", f"{case.error:.1e}", help=f"Against `{case.reference}`, the kernel's PyTorch spec, on "
            "the same inputs (float32: a few ulps of rounding is the floor).")
m[2].metric("Outputs stored exactly once", "yes" if once else "no",
            help=f"Every element of {', '.join(case.outputs)} written by one store of one program.")
m[3].metric("Accesses outside the buffers", len(launch.strays()),
            help="Loads or stores at addresses in none of the kernel's tensors: a missing mask would land here.")
st.caption(NOTES[kernel])

g = st.columns([2, 1])
g[0].plotly_chart(grid_chart(launch), key="kern_grid")
EVERY = -1  # not None: a selectbox shows None as no choice at all
follow = g[1].selectbox("Follow one program", [EVERY, *range(launch.programs)], key="k_kern_follow",
                        format_func=lambda p: "every program" if p == EVERY else label(launch, p),
                        help="Its elements keep their colour; every other program's fade.")
follow = None if follow is None or follow == EVERY or follow >= launch.programs else follow
g[1].caption("A cell's colour is the program that loaded or stored it; grey: several programs did; blank: none. "
             "Hover a cell for its programs and how many loads and stores it took.")

if kernel == "paged decode attention":
    st.plotly_chart(walk_chart(launch, follow or 0, values["block_size"]), key="kern_walk")
    st.caption(f"Contexts of {', '.join(map(str, case.lens))} tokens, in blocks of {values['block_size']}, handed out "
               f"shuffled from the pool. Token t lies in slot table[b, t // {values['block_size']}] · "
               f"{values['block_size']} + t % {values['block_size']}: a run along a block, then a jump to the next. "
               "In the block table, the zeros past a sequence's last block are padding, never read.")
labels = {"table_ptr": case.tables, "ctx_ptr": torch.tensor(case.lens)} if case.lens else {}
half = st.columns(2)
for i, name in enumerate(launch.buffers):
    values_shown = labels[name].numpy() if name in labels else None
    half[i % 2].plotly_chart(buffer_map(launch, name, follow, values_shown), key=f"kern_buf_{name}")

st.subheader("Speed against the roofline")
if INTERPRETED or not torch.cuda.is_available():
    st.info("These figures need a GPU. Here the kernels run in Triton's interpreter, one program after another in "
            "numpy: its timings say nothing about the hardware, so none are shown.", icon=":material/speed:")
else:
    from minillm_visualizer.kernels.speed import SIZES, measure
    if st.button(f"Measure {kernel} at {SIZES[kernel]}", key="kern_b_measure", icon=":material/timer:"):
        with st.spinner("Measuring the GPU's peaks, then the kernel..."):
            st.session_state["kern_measured"] = (kernel, *measure(kernel))
    if st.session_state.get("kern_measured", (None,))[0] == kernel:
        _, row, hw = st.session_state["kern_measured"]
        s = st.columns(4)
        s[0].metric("Triton", f"{row['triton us']:.1f} µs", help=f"torch: {row['torch us']:.1f} µs")
        s[1].metric("Bandwidth", f"{row['GB/s']:,.0f} GB/s", f"{row['of peak BW']:.0%} of the copy peak",
                    delta_color="off", delta_arrow="off")
        s[2].metric("Compute", f"{row['TFLOP/s']:.1f} TFLOP/s", f"{row['of peak FLOP/s']:.0%} of the matmul peak",
                    delta_color="off", delta_arrow="off")
        s[3].metric("vs torch", f"{row['speedup']:.2f}x")
        # FLOP per byte; a kernel with next to no arithmetic is placed at 0.1, on the bandwidth slope all the same
        intensity = row["TFLOP/s"] * 1e3 / row["GB/s"] or 0.1
        st.plotly_chart(roofline_chart(hw, "bfloat16", [{"name": f"{kernel}, measured", "intensity": intensity,
                                                          "flops": row["GB/s"] * 1e9 * intensity,
                                                          "kind": "measured"}]), key="kern_roofline")
        st.caption(f"Bytes counted: what the kernel must read and write at least"
                   f"{'' if row['TFLOP/s'] else '; it does next to no arithmetic, so it sits at 0.1 FLOP/B'}. "
                   f"{hw.source}.")
    else:
        st.caption("Press the button: the GPU's copy bandwidth and matmul FLOP/s are measured first, then the kernel "
                   "and its torch reference (median of 20).")
