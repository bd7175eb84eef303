"""Hub errors name their cause: a repo or revision that does not exist, a missing or wrong token,
an empty repo (a push that failed half-way), a server that refused a feature; the CLI says each in
one line."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
from hub_testing import TOKEN, assert_cache_clean, assert_same_model, tiny  # tests/hub_testing.py

import vitzoo
from vitzoo.weights.hub import explain
from vitzoo.errors import HubError

pytestmark = pytest.mark.usefixtures("hermetic_hub")  # tests/conftest.py


def test_a_repo_or_revision_that_does_not_exist_is_named(hub_server):
    """A missing repo is named with its server, a missing revision with its repo; nothing cached."""
    missing = f"no model repository alice/missing on {re.escape(hub_server.url)}"
    with pytest.raises(HubError, match=missing):
        vitzoo.from_pretrained("hf-hub:alice/missing")
    tiny().push_to_hub("alice/exists", token=TOKEN)
    with pytest.raises(HubError, match="has no revision 'v9'"):
        vitzoo.from_pretrained("hf-hub:alice/exists@v9")
    assert_cache_clean()


def test_a_wrong_token_is_said_to_be_refused_on_push_and_pull(hub_server, monkeypatch):
    """A wrong token is refused by name, writing and reading; without one a private repo is not
    found (the Hub does not say it exists); the right one reads it."""
    refused = r"refused the token \(401 Unauthorized\) trying to"
    with pytest.raises(HubError, match=rf"{refused} write to alice/t"):
        tiny().push_to_hub("alice/t", token="wrong")
    model = tiny()
    model.push_to_hub("alice/t", token=TOKEN, private=True)
    monkeypatch.setenv("HF_TOKEN", "wrong")
    with pytest.raises(HubError, match=rf"{refused} read alice/t: set a valid token"):
        vitzoo.from_pretrained("hf-hub:alice/t")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(HubError, match="no model repository alice/t .*private"):
        vitzoo.from_pretrained("hf-hub:alice/t")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    assert_same_model(model, vitzoo.from_pretrained("hf-hub:alice/t"))
    assert_cache_clean()


def test_cli_errors_are_one_line_messages(hub_server, monkeypatch, capsys, tmp_path):
    """`vitzoo pull` and `vitzoo push` say a Hub error in one line, exit 2, upload nothing."""
    from vitzoo.cli import main

    assert main(["pull", "alice/nothing-here"]) == 2
    assert "vitzoo pull: error: no model repository alice/nothing-here" in capsys.readouterr().err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "alice/nothing-here@v1"]) == 2
    assert "not in the Hugging Face cache" in capsys.readouterr().err
    assert main(["push", str(tmp_path), "alice/x"]) == 2  # not a saved model: nothing is uploaded
    assert "vitzoo push: error:" in capsys.readouterr().err


def test_an_empty_repo_is_said_to_be_empty_not_a_missing_file(hub_server):
    from huggingface_hub import HfApi

    HfApi(endpoint=hub_server.url, token=TOKEN).create_repo("alice/half-pushed")
    with pytest.raises(HubError, match=r"alice/half-pushed on .* holds no model files .* an empty "
                                       r"repo.*push the model again"):
        vitzoo.from_pretrained("hf-hub:alice/half-pushed")


class Refused(Exception):
    """An HTTP error as huggingface_hub raises it: the server's answer, 501 on the Xet endpoint."""
    response = SimpleNamespace(status_code=501, request=SimpleNamespace(
        method="GET", url="http://127.0.0.1:1/api/models/alice/m/xet-write-token/main"))


class ReadError(Exception):
    """The retry after the refusal broke off."""


def test_a_refused_feature_is_named_not_a_server_to_wait_for():
    try:
        try:
            raise Refused("501 Server Error: Not Implemented")
        except Refused:
            raise ReadError("connection reset by peer")  # noqa: B904 (as huggingface_hub chains it)
    except ReadError as exc:
        said = str(explain(exc, "alice/m", None, "http://127.0.0.1:1", writing=True))
    assert "501 Not Implemented" in said and "xet-write-token" in said
    assert "HF_HUB_DISABLE_XET=1" in said
    assert "broke off" not in said and "will not help" in said
