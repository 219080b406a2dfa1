"""Running a server: uvicorn serves HTTP from a thread of its own while the engine steps the
batches in the calling thread, the one that loaded the model (why: `dllm.serve.engine`)."""
from __future__ import annotations

import signal
import threading
import time
from typing import Callable


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def check_port(port) -> None:
    """Raise ValueError unless `port` is a TCP port number (0 picks a free one)."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer in 0-65535 (0 picks a free one), got {port!r}")


def serve(app, *, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info",
          on_started: Callable[[str], None] | None = None) -> None:
    """Serve `app` (from `build_app(..., engine_thread=False)`) until the engine stops: Ctrl-C or
    SIGTERM (when called from the main thread), `app.state.engine.stop()`, or the HTTP server
    ending; the requests still open are answered 503. `on_started(url)` is called in a thread
    of its own once the server listens, with its base URL (`port=0` picks a free port). Raises
    RuntimeError when the server could not start (the address in use, say), ValueError for a port
    outside 0-65535."""
    import uvicorn

    check_port(port)
    engine = app.state.engine
    if app.state.engine_thread:
        raise ValueError("serve() runs the engine in this thread; build the app with engine_thread=False")
    app.state.served = True
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level=log_level))
    http = threading.Thread(target=_run_http, args=(server,), name="dllm-http", daemon=True)
    http.start()
    if on_started is not None:
        threading.Thread(target=_announce, args=(server, http, on_started), name="dllm-started", daemon=True).start()
    in_main = threading.current_thread() is threading.main_thread()
    # SIGINT too: a process started as a shell's background job inherits it ignored
    previous = {sig: signal.signal(sig, _interrupt) for sig in STOP_SIGNALS} if in_main else {}
    try:
        engine.run(keep_running=http.is_alive)
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.should_exit = True
        http.join()
    if not server.started:
        raise RuntimeError(f"the server did not start on {host}:{port} (its log says why)")


def _interrupt(signum, frame) -> None:
    """SIGINT and SIGTERM stop the server as Ctrl-C does."""
    raise KeyboardInterrupt


def _run_http(server) -> None:
    """uvicorn's loop; a server that cannot start exits its thread (its log says why)."""
    try:
        server.run()
    except SystemExit:
        pass


def _announce(server, http: threading.Thread, on_started: Callable[[str], None]) -> None:
    """Wait until `server` listens (or its thread ends), then call `on_started` with its URL."""
    while not server.started:
        if not http.is_alive():
            return
        time.sleep(0.02)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    on_started(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")   # IPv6 in brackets
