"""What the Hub commands refuse, and what they say when the Hub fails: a revision git refuses or a
repo id the Hub rejects is refused before any request; a server that never answers stops a pull or a
push after the Hub timeout (a cached model still loads); a push without a token, with HF_HUB_OFFLINE
or to an endpoint that is not a URL says so; a repo that holds broken weights is said to."""

from __future__ import annotations

import pytest
import torch
# tests/hub_testing.py
from hub_testing import (HANGS_AFTER_S, TOKEN, assert_same_model, pulled_once, tiny,
                         within)

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import CheckpointError, HubError


@pytest.fixture
def silent_server():
    """A loopback server that accepts connections and never answers; yields its URL."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    held, stop = [], threading.Event()

    def accept():
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_a_pull_from_a_silent_server_stops_and_says_how_to_work_offline(
        hermetic_hub, one_second, silent_server, monkeypatch):
    """A pull from a server that accepts and never answers stops after the Hub timeout with a
    HubError naming the server, HF_HUB_DOWNLOAD_TIMEOUT and how to work offline (HF_HUB_OFFLINE=1, a
    local path)."""
    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    with pytest.raises(HubError,
                       match=rf"(?s){silent_server} did not answer within 1 "
                             rf"s.*HF_HUB_DOWNLOAD_TIMEOUT.*HF_HUB_OFFLINE=1.*local"):
        within(HANGS_AFTER_S, lambda: vitzoo.from_pretrained("hf-hub:alice/silent"))


def test_a_push_to_a_silent_server_stops(hermetic_hub, one_second, silent_server, monkeypatch):
    """A push to a server that accepts and never answers stops after the Hub timeout with a HubError
    naming the server."""
    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    with pytest.raises(HubError, match=rf"{silent_server} did not answer within 1 s"):
        within(HANGS_AFTER_S, lambda: tiny().push_to_hub("alice/silent", token=TOKEN))


def test_a_cached_model_loads_when_the_server_is_silent(
        hermetic_hub, one_second, silent_server, monkeypatch):
    """A model pulled once loads from the cache when the server later accepts and never answers."""
    model = tiny()
    pulled_once(model, "alice/cached", hermetic_hub / "hub", monkeypatch)
    monkeypatch.setenv("HF_ENDPOINT", silent_server)
    assert_same_model(within(HANGS_AFTER_S,
                             lambda: vitzoo.from_pretrained("hf-hub:alice/cached")).eval(), model)


BAD_REVISIONS = ["../../..../x", "a/../b", "/main", "main/", "v1.", "a//b",
                 ".hidden", "x/.y", "br.lock",
                 "a@{1}", "@", "tab\there", "new\nline", "sp ace", "a~1", "a^",
                 "a:b", "a?", "a*", "a[0]",
                 "back\\slash", "del\x7f", ""]


GOOD_REVISIONS = ["main", "v1.0", "refs/pr/1", "feature/x-1", "a" * 40, "release_2026.11"]


@pytest.mark.parametrize("revision", GOOD_REVISIONS)
def test_revisions_git_accepts_are_accepted(revision):
    """Branch, tag, pull-request and commit names that git accepts are revisions."""
    from vitzoo.weights.hub import check_revision, parse

    assert check_revision(revision) == revision
    assert parse(f"hf-hub:org/name@{revision}") == ("org/name", revision)


@pytest.mark.parametrize("revision", BAD_REVISIONS)
def test_a_revision_git_refuses_is_refused_before_anything_is_sent(
        hermetic_hub, revision, monkeypatch):
    """A revision git's ref-name rules refuse (`..`, a leading or trailing `/`, a trailing `.`,
    `//`, a part starting with `.` or ending in `.lock`, `@{`, `@`, control characters, space,
    `~^:?*[\\`) is a HubError naming it, whether it comes after the @ of a reference or as
    `revision=`, on pull and on push, before any request: nothing is written into the cache or
    beside it."""
    from vitzoo.weights.hub import download

    monkeypatch.setenv("HF_ENDPOINT",
                       "http://127.0.0.1:9")  # nothing listens: a request would fail otherwise
    if revision:
        with pytest.raises(HubError, match="is not a revision"):
            vitzoo.from_pretrained(f"hf-hub:org/name@{revision}")
    with pytest.raises(HubError, match="is not a revision"):
        download("hf-hub:org/name", revision=revision)
    with pytest.raises(HubError, match="is not a revision"):
        tiny().push_to_hub("org/name", token=TOKEN, revision=revision)
    assert not (hermetic_hub / "hf_home").exists()


def test_the_cli_refuses_a_revision_git_refuses(hermetic_hub, tmp_path, capsys):
    """`vitzoo pull --revision` and `vitzoo push --revision` refuse such a name with a one-line
    error."""
    tiny().save_pretrained(tmp_path / "saved")
    assert main(["pull", "org/name", str(tmp_path / "out"), "--revision", "../../x"]) != 0
    assert main(["push", str(tmp_path / "saved"), "org/name", "--revision", "a..b"]) != 0
    err = capsys.readouterr().err
    assert "'../../x' is not a revision" in err and "'a..b' is not a revision" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("repo_id", ["org/a..b", "org/name--x", "org/" + "a" * 100, "org/-x"])
def test_a_repo_name_the_hub_rejects_is_the_same_hub_error_on_pull_and_push(
        hermetic_hub, monkeypatch, repo_id):
    """A repository name the Hub would reject is one HubError, the same on pull and on push."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(HubError, match="is not a valid Hub repo id") as pulled:
        vitzoo.from_pretrained(f"hf-hub:{repo_id}")
    with pytest.raises(HubError, match="is not a valid Hub repo id") as pushed:
        tiny().push_to_hub(repo_id, token=TOKEN)
    assert str(pulled.value) == str(pushed.value)


def test_push_to_a_bad_repo_says_what_push_takes(tmp_path, capsys):
    tiny().save_pretrained(tmp_path / "saved")
    assert main(["push", str(tmp_path / "saved"), "../evil"]) == 2
    err = capsys.readouterr().err
    assert "write ORG/NAME" in err and "hf-hub:" not in err


def test_a_push_without_a_token_says_none_was_sent(hermetic_hub, monkeypatch):
    """A push with no token anywhere says a token is needed and none was sent (not that it was
    refused)."""
    from hubserver import HubServer

    monkeypatch.setattr("huggingface_hub.get_token", lambda: None)
    with HubServer(hermetic_hub / "hub", token=TOKEN) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(HubError,
                           match="needs a token to write to alice/t and none was sent") as err:
            tiny().push_to_hub("alice/t")
    assert "refused" not in str(err.value)


def test_a_push_with_hf_hub_offline_says_offline_forbids_it(hermetic_hub, monkeypatch):
    """A push with HF_HUB_OFFLINE=1 says that the setting forbids it, not anything about the cache.
    """
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError,
                       match="HF_HUB_OFFLINE=1 forbids talking to the Hub.*unset "
                             "HF_HUB_OFFLINE") as err:
        tiny().push_to_hub("alice/t", token=TOKEN)
    assert "cache" not in str(err.value)


@pytest.mark.parametrize("endpoint", ["notaurl", "ftp://example.org", "http://"])
def test_an_endpoint_that_is_not_a_url_says_so(hermetic_hub, monkeypatch, endpoint):
    """HF_ENDPOINT that is not an http(s) URL is a HubError saying so, on pull and on push."""
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(HubError, match="is not an http\\(s\\) URL"):
        vitzoo.from_pretrained("hf-hub:alice/t")
    with pytest.raises(HubError, match="is not an http\\(s\\) URL"):
        tiny().push_to_hub("alice/t", token=TOKEN)


def test_offline_advice_for_an_uncached_revision_keeps_the_revision(hermetic_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubError, match=r"`vitzoo pull alice/model@v2`"):
        vitzoo.from_pretrained("hf-hub:alice/model@v2")


def test_a_broken_repo_is_not_said_to_be_fixed_by_downloading_again(hub_server, tmp_path):
    """Weights that do not load from a Hub repo whose files match their hashes: the error says the
    repo holds them so (a revision that works, or its owner), not only to download them again."""
    from huggingface_hub import HfApi

    tiny().save_pretrained(tmp_path / "saved")
    weights = tmp_path / "saved" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    api = HfApi(endpoint=hub_server.url,
                token=TOKEN)  # past vitzoo's push check, as another tool would
    api.create_repo("alice/broken")
    api.upload_folder(repo_id="alice/broken", folder_path=tmp_path / "saved")
    with pytest.raises(CheckpointError, match="the repo itself holds them so"):
        vitzoo.from_pretrained("hf-hub:alice/broken")
