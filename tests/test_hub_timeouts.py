"""No Hub call waits for ever: each request waits at most HF_HUB_DOWNLOAD_TIMEOUT (one second here)
to connect, to send and for each read, so a server that falls silent is given up and a cached model
then loads from the cache; a download that keeps coming, however slowly, is not cut off."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
from hub_testing import TOKEN, assert_same_model, loopback, tiny, within  # tests/hub_testing.py

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import HubError

pytestmark = pytest.mark.usefixtures("hermetic_hub", "one_second")  # tests/conftest.py
HANGS = 60  # s: a call still waiting then hangs (the waits under test take a few seconds)


def silent(connection) -> None:
    """Accepts the connection and never answers."""


@contextlib.contextmanager
def proxy(upstream: str, how: str, times: int, keep: int = 20_000):
    """A loopback proxy to `upstream` that, the first `times` times it sends a blob, passes `keep`
    bytes of it, then stops ("stall"), closes the connection ("cut") or sends the rest `keep`
    bytes at a time, 0.4 s apart ("slow")."""
    parts, left = urlsplit(upstream), [times]

    def answer(client) -> None:
        server, blob = socket.create_connection((parts.hostname, parts.port)), threading.Event()

        def back() -> None:
            sent = 0  # bytes of the blob
            with contextlib.suppress(OSError):
                while data := server.recv(keep):
                    if blob.is_set() and sent >= keep:
                        if how != "slow":  # a stalled connection stays open
                            return client.shutdown(socket.SHUT_RDWR) if how == "cut" else None
                        time.sleep(0.4)
                    sent += len(data) if blob.is_set() else 0
                    client.sendall(data)

        threading.Thread(target=back, daemon=True).start()
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                if data.startswith(b"GET /blobs/") and left[0] > 0:
                    left[0] -= 1
                    blob.set()
                server.sendall(data)

    with loopback(answer) as url:
        yield url
    assert left[0] < times, "no blob went through the proxy"


@pytest.mark.parametrize("pushing", [False, True], ids=["pull", "push"])
def test_a_silent_server_is_given_up_naming_the_timeout(monkeypatch, pushing):
    with loopback(silent) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        call = (lambda: tiny().push_to_hub("alice/t", token=TOKEN)) if pushing else (
            lambda: vitzoo.from_pretrained("hf-hub:alice/t"))
        said = rf"cannot reach the Hub at {url} \(ReadTimeout.*HF_HUB_DOWNLOAD_TIMEOUT\)"
        with pytest.raises(HubError, match=said):
            within(HANGS, call)


def test_a_cached_model_loads_when_the_server_falls_silent(hub_server, monkeypatch):
    model = tiny()
    model.push_to_hub("alice/cached", token=TOKEN)
    vitzoo.from_pretrained("hf-hub:alice/cached")
    with loopback(silent) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert_same_model(model, within(HANGS, lambda: vitzoo.from_pretrained(
            "hf-hub:alice/cached")))
        assert within(HANGS, lambda: main(["pull", "alice/cached"])) == 0


@pytest.mark.parametrize("how", ["stall", "cut", "slow"])
def test_a_download_that_stalls_breaks_or_crawls_completes(hub_server, monkeypatch, how):
    """A stalled or broken download is taken up again after the timeout; a slow one goes on."""
    model = tiny(embed_dim=64, mlp_dim=128)  # weights of 0.4 MB: many reads
    model.push_to_hub("alice/slow", token=TOKEN)
    with proxy(hub_server.url, how, times=1, keep=100_000) as url:  # slow: 1.6 s in all
        monkeypatch.setenv("HF_ENDPOINT", url)
        assert_same_model(model, within(HANGS, lambda: vitzoo.from_pretrained("hf-hub:alice/slow")))


def test_a_download_broken_off_each_time_fails_and_leaves_nothing(hub_server, hermetic_hub,
                                                                  monkeypatch):
    model = tiny(embed_dim=64, mlp_dim=128)
    model.push_to_hub("alice/cut", token=TOKEN)
    with proxy(hub_server.url, "cut", times=99) as url:  # huggingface_hub tries 5 times, 1 s apart
        monkeypatch.setenv("HF_ENDPOINT", url)
        with pytest.raises(HubError, match=f"cannot reach the Hub at {url}"):
            within(HANGS, lambda: vitzoo.from_pretrained("hf-hub:alice/cut"))
    assert not list(hermetic_hub.glob("hf_home/hub/models--alice--cut/snapshots/*/model.*"))
    monkeypatch.setenv("HF_ENDPOINT", hub_server.url)
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/cut"))
