"""A loopback HTTP server for built reports (standard library only)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

Pages = Mapping[str, str | Callable[[], str]]
"""URL path -> HTML, or a callable returning it (rebuilt on every request)."""


def _handler(pages: Pages) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "exgrpo-dashboard"

        def do_GET(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            page = pages.get(path)
            if page is None:
                body, code, ctype = b"not found\n", 404, "text/plain; charset=utf-8"
            else:
                try:
                    text = page() if callable(page) else page
                    body, code, ctype = text.encode("utf-8"), 200, "text/html; charset=utf-8"
                except Exception as e:  # a rebuild failed: say so in the browser
                    body, code, ctype = f"error: {type(e).__name__}: {e}\n".encode(), 500, "text/plain; charset=utf-8"
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args) -> None:  # quiet
            pass

    return Handler


def make_server(pages: Pages, host: str = "127.0.0.1", port: int = 8090) -> ThreadingHTTPServer:
    """Bind (port 0: any free port); raises OSError with a readable message when the port is taken."""
    try:
        srv = ThreadingHTTPServer((host, port), _handler(pages))
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port} ({e.strerror or e}); pick another with --port "
                      "(0: any free port)") from None
    srv.daemon_threads = True
    return srv


def url_of(srv: ThreadingHTTPServer, path: str = "/") -> str:
    host, port = srv.server_address[:2]
    return f"http://{host}:{port}{path}"


def start_server(pages: Pages, host: str = "127.0.0.1", port: int = 0) -> tuple[ThreadingHTTPServer, str]:
    """Serve ``pages`` from a daemon thread; returns the server (``.shutdown()`` stops it) and its URL."""
    srv = make_server(pages, host, port)
    threading.Thread(target=srv.serve_forever, name="exgrpo-dashboard", daemon=True).start()
    return srv, url_of(srv)


def serve(pages: Pages, host: str = "127.0.0.1", port: int = 8090,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Serve in this thread until Ctrl-C (KeyboardInterrupt)."""
    srv = make_server(pages, host, port)
    if on_ready is not None:
        on_ready(url_of(srv))
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
