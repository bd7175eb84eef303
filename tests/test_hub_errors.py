"""A Hub call that fails raises one HubError naming the cause and the fix; the CLI says it in one
line and exits with status 2. Names git or the Hub refuse are refused before any request."""

from __future__ import annotations

import contextlib
import re

import pytest
from huggingface_hub import HfApi
from hub_testing import TOKEN, assert_same_model, loopback, tiny  # tests/hub_testing.py

import vitzoo
from vitzoo.cli import main
from vitzoo.errors import HubError
from vitzoo.weights.hub import check_revision, download, parse, upload_folder

pytestmark = pytest.mark.usefixtures("hermetic_hub")  # tests/conftest.py
NOWHERE = "http://127.0.0.1:9"  # nothing listens there: a request would fail otherwise


def test_a_missing_repo_or_revision_is_named(hub_server):
    with pytest.raises(HubError, match=f"no model repo alice/gone on {re.escape(hub_server.url)}"):
        vitzoo.from_pretrained("hf-hub:alice/gone")
    tiny().push_to_hub("alice/here", token=TOKEN)
    with pytest.raises(HubError, match="alice/here on .* has no revision 'v9'"):
        vitzoo.from_pretrained("hf-hub:alice/here@v9")


def test_a_wrong_or_missing_token_names_hf_token(hub_server, monkeypatch):
    for token in ("wrong", None):
        with pytest.raises(HubError, match="needs a valid token to push alice/t: set HF_TOKEN"):
            tiny().push_to_hub("alice/t", token=token)
    model = tiny()
    model.push_to_hub("alice/t", token=TOKEN, private=True)
    monkeypatch.setenv("HF_TOKEN", "wrong")
    with pytest.raises(HubError, match="needs a valid token to pull alice/t: set HF_TOKEN"):
        vitzoo.from_pretrained("hf-hub:alice/t")
    monkeypatch.delenv("HF_TOKEN")  # the Hub does not say that a private repo exists
    with pytest.raises(HubError, match="no model repo alice/t .* if it is private, set HF_TOKEN"):
        vitzoo.from_pretrained("hf-hub:alice/t")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/t"))


def test_a_server_that_answers_a_web_page_is_named(monkeypatch):
    def page(connection):
        with contextlib.suppress(OSError):
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\n"
                               b"Content-Length: 13\r\nConnection: close\r\n\r\n<html></html>")

    with loopback(page) as url:
        monkeypatch.setenv("HF_ENDPOINT", url)
        said = "answered with a page, not the Hub's JSON: check HF_ENDPOINT"
        with pytest.raises(HubError, match=said):
            vitzoo.from_pretrained("hf-hub:alice/page")
        with pytest.raises(HubError, match=said):
            tiny().push_to_hub("alice/page", token=TOKEN)


def test_an_empty_repo_is_said_to_hold_no_model(hub_server):
    HfApi(endpoint=hub_server.url, token=TOKEN).create_repo("alice/empty")
    with pytest.raises(HubError, match="alice/empty holds no model files: push one"):
        vitzoo.from_pretrained("hf-hub:alice/empty")


@pytest.mark.parametrize("endpoint", ["notaurl", "ftp://example.org", "http://", NOWHERE])
def test_an_endpoint_out_of_reach_names_hf_endpoint(monkeypatch, endpoint):
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    with pytest.raises(HubError, match="cannot reach the Hub at .*: check HF_ENDPOINT") as pulling:
        vitzoo.from_pretrained("hf-hub:alice/t")
    with pytest.raises(HubError, match="cannot reach the Hub at .*: check HF_ENDPOINT") as pushing:
        tiny().push_to_hub("alice/t", token=TOKEN)
    assert pulling.value.not_cached and not pushing.value.not_cached


@pytest.mark.parametrize("revision", [
    "../../x", "a/../b", "/main", "main/", "v1.", "a//b", ".hidden", "x/.y", "br.lock", "a@{1}",
    "@", "tab\there", "new\nline", "sp ace", "a~1", "a^", "a:b", "a?", "a*", "a[0]", "back\\slash",
    "del\x7f", ""])
def test_a_revision_git_refuses_is_refused_before_any_request(hermetic_hub, monkeypatch, revision):
    monkeypatch.setenv("HF_ENDPOINT", NOWHERE)
    calls = [lambda: download("hf-hub:org/name", revision=revision),
             lambda: upload_folder(hermetic_hub, "org/name", [], token=TOKEN, revision=revision)]
    for call in calls + [lambda: parse(f"hf-hub:org/name@{revision}")] * bool(revision):
        with pytest.raises(HubError, match="is not a revision: name a branch, tag or commit"):
            call()
    assert not (hermetic_hub / "hf_home").exists()


@pytest.mark.parametrize("revision", ["main", "v1.0", "refs/pr/1", "feature/x-1", "a" * 40])
def test_a_revision_git_accepts_is_one(revision):
    assert parse(f"hf-hub:org/name@{revision}") == ("org/name", check_revision(revision))


@pytest.mark.parametrize("repo_id", ["org/a..b", "org/name--x", "org/" + "a" * 100, "org/-x",
                                     "noslash", "a/b/c", "org/name@"])
def test_a_repo_name_the_hub_refuses_is_refused_before_any_request(monkeypatch, repo_id):
    monkeypatch.setenv("HF_ENDPOINT", NOWHERE)
    for call in (lambda: vitzoo.from_pretrained(f"hf-hub:{repo_id}"),
                 lambda: tiny().push_to_hub(repo_id, token=TOKEN)):
        with pytest.raises(HubError, match=re.escape(repo_id)) as error:
            call()
        assert "cannot reach" not in str(error.value)


def test_the_cli_says_a_hub_error_in_one_line(hub_server, tmp_path, monkeypatch, capsys):
    assert main(["pull", "alice/nothing"]) == 2
    assert "vitzoo pull: error: no model repo alice/nothing" in capsys.readouterr().err
    tiny().save_pretrained(tmp_path / "saved")
    assert main(["push", str(tmp_path / "saved"), "org/name", "--revision", "a..b"]) == 2
    assert main(["pull", "org/name", str(tmp_path / "out"), "--revision", "../x"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert "'a..b' is not a revision" in err[0] and "'../x' is not a revision" in err[1]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "alice/nothing@v1"]) == 2
    assert "alice/nothing@v1 is not in the Hugging Face cache" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
