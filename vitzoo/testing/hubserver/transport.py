"""HTTP plumbing under the endpoint handlers: the threaded server, dispatch, request bodies (chunked too), JSON
and error answers."""

from __future__ import annotations

import json
import re
import secrets
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from .model import ErrorAnswer

if TYPE_CHECKING:
    from .store import HubStore

MAX_JSON_BODY = 2 * 1024**3  # a commit carries its regular files inline, base64-encoded
IO_CHUNK = 1024 * 1024

_RANGE_RE = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte range a `Range` header asks for; None means the whole file."""
    if not header:
        return None
    match = _RANGE_RE.match(header.strip())
    if match is None:
        return None  # multiple or unknown ranges: serving the whole file is allowed by RFC 9110
    first, last = match.groups()
    if first:
        start, end = int(first), min(int(last), size - 1) if last else size - 1
    elif last:
        start, end = max(size - int(last), 0), size - 1
    else:
        return None
    if start >= size or start > end:
        raise ErrorAnswer(416, f"Range {header!r} not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end


class RequestHandler(BaseHTTPRequestHandler):
    """Turns each request into a call of the handler `route` picks; a `ErrorAnswer` becomes an error answer."""

    protocol_version = "HTTP/1.1"  # keep-alive: the client pools its connections
    server_version = "vitzoo-hubserver/1"
    timeout = 120  # idle keep-alive connections end instead of pinning a thread forever
    server: HubHTTPServer

    def route(self, method: str, segments: list[str]) -> Callable[[], None]:
        """The handler for a request to `/<segments...>`; raises `ErrorAnswer` when there is none."""
        raise NotImplementedError

    def _dispatch(self) -> None:
        self._body_consumed = False
        self._response_started = False
        url = urlsplit(self.path)
        self._query = parse_qs(url.query)
        try:
            self.route(self.command, url.path.split("/")[1:])()
        except ErrorAnswer as err:
            self._fail(err)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client went away
        except Exception:  # a bug: answer 500 and show it, whatever the verbosity
            traceback.print_exc(file=sys.stderr)
            self._fail(ErrorAnswer(500, "Internal server error"))
        finally:
            if self._has_body() and not self._body_consumed:
                self.close_connection = True  # unread body bytes would be taken for the next request

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = _dispatch

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.verbose:
            sys.stderr.write(f"[hubserver] {self.address_string()} {format % args}\n")

    def send_response(self, code: int, message: str | None = None) -> None:
        self._response_started = True
        super().send_response(code, message)

    def _fail(self, err: ErrorAnswer) -> None:
        if self._response_started:
            self.close_connection = True  # too late for an error answer: cutting the connection tells the client
        else:
            self._send_error(err)

    def _base_url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{self.headers.get('Host') or f'{host}:{port}'}"

    def _query_flag(self, name: str) -> bool:
        return self._query.get(name, [""])[0].lower() in ("1", "true")

    # -- request bodies -----------------------------------------------------------------------------

    def _is_chunked(self) -> bool:
        return "chunked" in self.headers.get("Transfer-Encoding", "").lower()

    def _has_body(self) -> bool:
        if self._is_chunked():
            return True
        try:
            return int(self.headers.get("Content-Length") or 0) > 0
        except ValueError:
            return True  # unknown length: treat as unread, so the connection is closed

    def _iter_body(self) -> Iterator[bytes]:
        if self._is_chunked():
            yield from self._iter_chunked()
        else:
            yield from self._read_exactly(int(self.headers.get("Content-Length") or 0))
        self._body_consumed = True

    def _iter_chunked(self) -> Iterator[bytes]:
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ErrorAnswer(400, "Malformed chunked request body") from None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return
            yield from self._read_exactly(size)
            self.rfile.readline(8)  # the CRLF closing each chunk

    def _read_exactly(self, size: int) -> Iterator[bytes]:
        while size > 0:
            chunk = self.rfile.read(min(IO_CHUNK, size))
            if not chunk:
                raise ErrorAnswer(400, "Request body ended early")
            size -= len(chunk)
            yield chunk

    def _read_body(self) -> bytes:
        parts, total = [], 0
        for chunk in self._iter_body():
            total += len(chunk)
            if total > MAX_JSON_BODY:
                raise ErrorAnswer(413, "Request body too large")
            parts.append(chunk)
        return b"".join(parts)

    def _read_json(self) -> Any:
        body = self._read_body()
        try:
            return json.loads(body) if body else {}
        except ValueError:
            raise ErrorAnswer(400, "Request body is not valid JSON") from None

    # -- answers ------------------------------------------------------------------------------------

    def _send_head(self, status: int, headers: Mapping[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if self._has_body() and not self._body_consumed:
            # Answering before the body is read (e.g. 401): the connection will be closed, so say so,
            # or the client reuses it and its next request meets a closed socket.
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()

    def _send_json(
        self,
        payload: Any,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> None:
        body = json.dumps(payload).encode()
        self._send_head(status, {"Content-Type": content_type, "Content-Length": str(len(body)), **(headers or {})})
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_error(self, err: ErrorAnswer) -> None:
        headers = dict(err.headers)
        if err.code:
            headers["X-Error-Code"] = err.code
        # Header values must be latin-1 and single-line; the JSON body keeps the full message.
        headers["X-Error-Message"] = err.message.encode("ascii", "replace").decode().replace("\n", " ")
        self._send_json({"error": err.message}, err.status, headers)


class HubHTTPServer(ThreadingHTTPServer):
    """The HTTP server: one thread per connection, each request handled by `handler` over `store`."""

    daemon_threads = True  # a keep-alive connection must not hold up shutdown

    def __init__(self, address: tuple[str, int], handler: type[RequestHandler], store: HubStore, token: str | None,
                 verbose: bool) -> None:
        super().__init__(address, handler)
        self.store = store
        self.token = token
        self.verbose = verbose
        # Signs LFS upload URLs: the client PUTs to them without its token, as to presigned S3 URLs.
        self.upload_secret = secrets.token_bytes(32)
        self._connections: set[socket.socket] = set()
        self._connections_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._connections_lock:
            self._connections.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request) -> None:
        with self._connections_lock:
            self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        """A client that went away between requests (a timeout, a closed keep-alive) is not an error of
        the server's: only anything else is printed, as socketserver prints it."""
        if not isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            super().handle_error(request, client_address)

    def close_connections(self) -> None:
        """End open keep-alive connections too: a stopped server answers nothing more."""
        with self._connections_lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by the client
