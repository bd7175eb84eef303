"""No Hub call waits for ever: a server that never finishes its answer is given up after the Hub
timeout (HF_HUB_DOWNLOAD_TIMEOUT), a cached model then loads from the cache, and a slow transfer
that keeps coming is not cut off."""

from __future__ import annotations

import time

import pytest
from hub_testing import HANGS_AFTER_S, TOKEN, pulled_once, tiny, within  # tests/hub_testing.py

import vitzoo
from vitzoo.errors import HubError

pytestmark = pytest.mark.usefixtures("hermetic_hub")  # tests/conftest.py


def same_model(a, b) -> bool:
    import torch

    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        return a.config == b.config and torch.equal(a.eval()(x), b.eval()(x))


@pytest.fixture
def dribbling_server():
    """A loopback server that answers every request with a status line, then one header line every
    0.3 s, never finishing the head: each read succeeds well within a per-read timeout. It stops by
    itself after 40 s (and at teardown). Yields its URL."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    stop = threading.Event()
    started = time.monotonic()

    def dribble(conn):
        with conn:
            try:
                conn.settimeout(1)
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                n = 0
                while not stop.wait(0.3) and time.monotonic() - started < 40:
                    conn.sendall(f"X-Wait-{n}: still coming\r\n".encode())
                    n += 1
            except OSError:
                pass

    def accept():
        while not stop.is_set() and time.monotonic() - started < 40:
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            threading.Thread(target=dribble, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    listener.close()


def test_a_pull_from_a_dribbling_server_stops(one_second, dribbling_server, monkeypatch):
    """A server that sends a header line every 0.3 s (never a whole answer) is given up after the
    timeout, as a silent server is: a HubError naming the server and HF_HUB_DOWNLOAD_TIMEOUT."""
    monkeypatch.setenv("HF_ENDPOINT", dribbling_server)
    started = time.monotonic()
    said = rf"(?s){dribbling_server} did not answer within 1 s.*HF_HUB_DOWNLOAD_TIMEOUT"
    with pytest.raises(HubError, match=said):
        within(HANGS_AFTER_S, lambda: vitzoo.from_pretrained("hf-hub:alice/slow"))
    assert time.monotonic() - started < 12


def test_a_cached_model_loads_when_the_server_dribbles(tmp_path, one_second, dribbling_server,
                                                       monkeypatch):
    """A model pulled once loads from the cache when the server later dribbles (from_pretrained and
    `vitzoo pull`), as when it is silent."""
    from vitzoo.cli import main

    model = tiny()
    pulled_once(model, "alice/cached", tmp_path / "hub", monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", dribbling_server)
    started = time.monotonic()
    loaded = within(HANGS_AFTER_S, lambda: vitzoo.from_pretrained("hf-hub:alice/cached"))
    assert same_model(loaded, model)
    assert within(HANGS_AFTER_S, lambda: main(["pull", "alice/cached"])) == 0
    assert time.monotonic() - started < 20


def test_a_push_to_a_dribbling_server_stops(one_second, dribbling_server, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", dribbling_server)
    started = time.monotonic()
    with pytest.raises(HubError, match=rf"{dribbling_server} did not answer within 1 s"):
        within(HANGS_AFTER_S, lambda: tiny().push_to_hub("alice/slow", token=TOKEN))
    assert time.monotonic() - started < 12


def test_a_download_that_keeps_coming_is_not_cut_off(one_second):
    """The bound is on waiting, not on transfers: a 1 MiB answer sent in 128 KiB pieces every 0.4 s
    (3 s in all, three times the timeout) arrives whole."""
    import socket
    import threading

    from huggingface_hub.utils import get_session

    from vitzoo.weights import hub

    body = bytes(range(256)) * 4096
    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            conn.sendall(head.encode())
            for start in range(0, len(body), 128 * 1024):
                time.sleep(0.4)
                conn.sendall(body[start:start + 128 * 1024])

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    hub._bound_requests()
    started = time.monotonic()
    response = get_session().get(f"http://127.0.0.1:{listener.getsockname()[1]}/file")
    assert response.content == body and time.monotonic() - started > 3
    thread.join(5)
    listener.close()
