"""The OpenAI-compatible HTTP server: `/v1/completions`, `/v1/chat/completions` (streaming or not),
`/v1/models`, `/health`, `/metrics`, over one AsyncLLM.

    from minillm.serve import serve_in_thread
    with serve_in_thread("tiny") as server:   # server.base_url: http://127.0.0.1:PORT (add /v1 for clients)
        ...

    python -m minillm serve --model tiny --port 8000
"""
from minillm.serve.admission import admit
from minillm.serve.app import build_app
from minillm.serve.server import ServerHandle, run_server, serve_in_thread

__all__ = ["ServerHandle", "admit", "build_app", "run_server", "serve_in_thread"]
