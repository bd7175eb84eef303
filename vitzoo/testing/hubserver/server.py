"""`HubServer`: the HTTP server over a `HubStore`, run from a background thread."""

from __future__ import annotations

import os
import threading
from types import TracebackType

from .handler import HubHandler
from .store import HubStore
from .transport import HubHTTPServer


class HubServer:
    """A Hub-compatible server over a directory, served from a background thread.

    >>> with HubServer(tmp_path / "hub", token="secret") as server:   # doctest: +SKIP
    ...     HfApi(endpoint=server.url, token="secret").create_repo("alice/vit")
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        token: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        username: str = "user",
        verbose: bool = False,
    ) -> None:
        self.store = HubStore(root, username=username)
        self.token = token
        self._address = (host, port)
        self._verbose = verbose
        self._httpd: HubHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """The endpoint, e.g. "http://127.0.0.1:43817" (the server must be started)."""
        if self._httpd is None:
            raise RuntimeError("HubServer is not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def client_env(self) -> dict[str, str]:
        """Environment for a child process whose huggingface_hub should talk to this server."""
        env = {"HF_ENDPOINT": self.url, "HF_HUB_DISABLE_XET": "1"}
        if self.token is not None:
            env["HF_TOKEN"] = self.token
        return env

    def start(self) -> HubServer:
        if self._httpd is None:
            httpd = self._httpd = HubHTTPServer(self._address, HubHandler, self.store, self.token, self._verbose)
            # A short poll interval makes stop() quick: shutdown() waits for the loop to notice.
            self._thread = threading.Thread(
                target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="hubserver", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        self._httpd.close_connections()
        if self._thread is not None:
            self._thread.join()
        self._httpd, self._thread = None, None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
