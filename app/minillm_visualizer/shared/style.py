"""What several pages draw alike, so that one thing looks the same on every page: the KV pool's states,
latency percentiles and their SLO, the box a text of tokens sits in, and the units the figures use."""
FREE, CACHED, SHARED = "#e9ecef", "#a5c8e4", "#212529"  # KV blocks: free, cached (a prefix kept), shared
P50, P90, P99 = "#4c72b0", "#dd8452", "#c44e52"
SLO = "#212529"
BOX = ("font-family:ui-monospace,SFMono-Regular,Menlo,monospace;font-size:0.85rem;line-height:1.75;"
       "white-space:pre-wrap;word-break:break-word;border:1px solid #dee2e6;border-radius:6px;padding:0.5rem 0.7rem")
MIB = 2**20  # bytes are shown in MiB
MS = 1000.0  # seconds are shown in ms
