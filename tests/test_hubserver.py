"""The test Hub (tests/hubserver): what the other tests and a user without the network rely on,
driven by the real huggingface_hub client against a server on 127.0.0.1, its repos in tmp_path."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from hub_testing import TOKEN  # tests/hub_testing.py
from hubserver import HubServer, git_blob_sha1

pytestmark = pytest.mark.usefixtures("hermetic_hub")  # tests/conftest.py
ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = bytes(range(256)) * 64  # binary: the Hub keeps it in LFS


def test_the_command_line_prints_the_url_first_and_repos_outlive_the_server(tmp_path):
    """`python -m tests.hubserver --root DIR --port 0 --token T --user U` prints its URL as its
    first line and serves; a repo pushed to it is there for the next server on the same root."""
    def start() -> tuple[subprocess.Popen, str]:
        command = [sys.executable, "-m", "tests.hubserver", "--root", str(tmp_path / "hub"),
                   "--port", "0", "--token", TOKEN, "--user", "bob"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        return process, process.stdout.readline().strip()

    process, url = start()
    try:
        assert url.startswith("http://127.0.0.1:") and url.split(":")[-1].isdigit()
        api = HfApi(endpoint=url, token=TOKEN)
        assert api.create_repo("kept").endswith("/bob/kept")  # --user: the namespace of a bare name
        api.upload_file(path_or_fileobj=b"hello\n", path_in_repo="a.txt", repo_id="bob/kept")
    finally:
        process.terminate()
        assert process.wait(10) == 0
    process, url = start()
    try:
        assert open(hf_hub_download("bob/kept", "a.txt", endpoint=url), "rb").read() == b"hello\n"
    finally:
        process.terminate()
        process.wait(10)


def test_the_token_guards_writes_and_private_repos(tmp_path):
    """Writes need the token; a private repo is not found without it; any other token is refused
    (401) even on a public repo, as the Hub refuses it."""
    with HubServer(tmp_path / "hub", token=TOKEN) as hub:
        api, anonymous = HfApi(endpoint=hub.url, token=TOKEN), HfApi(endpoint=hub.url, token=False)
        with pytest.raises(HfHubHTTPError) as refused:
            anonymous.create_repo("alice/open")
        assert refused.value.response.status_code == 401
        api.create_repo("alice/open")
        api.create_repo("alice/secret", private=True)
        assert anonymous.model_info("alice/open").id == "alice/open"
        with pytest.raises(RepositoryNotFoundError):
            anonymous.model_info("alice/secret")
        assert api.model_info("alice/secret").private
        with pytest.raises(HfHubHTTPError) as refused:
            HfApi(endpoint=hub.url, token="wrong").model_info("alice/open")
        assert refused.value.response.status_code == 401


def test_files_are_named_by_the_hashes_the_hub_gives_them(tmp_path):
    """A binary file is served as an LFS file (its sha256 as X-Linked-Etag), a text file by its git
    blob sha1: the Hugging Face cache names its blobs by these, which vitzoo checks before loading.
    A range of bytes is served as asked (a download broken off resumes so)."""
    with HubServer(tmp_path / "hub", token=TOKEN) as hub:
        api = HfApi(endpoint=hub.url, token=TOKEN)
        api.create_repo("alice/files")
        for name, data in (("model.safetensors", WEIGHTS), ("config.json", b"{}\n")):
            api.upload_file(path_or_fileobj=data, path_in_repo=name, repo_id="alice/files")
        weights = Path(hf_hub_download("alice/files", "model.safetensors", endpoint=hub.url))
        config = Path(hf_hub_download("alice/files", "config.json", endpoint=hub.url))
        assert weights.resolve().name == hashlib.sha256(WEIGHTS).hexdigest()
        assert config.resolve().name == git_blob_sha1(b"{}\n")
        listed = {f.path: f for f in api.list_repo_tree("alice/files")}
        assert listed["model.safetensors"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
        request = urllib.request.Request(f"{hub.url}/alice/files/resolve/main/model.safetensors",
                                         headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(request) as answer:
            assert answer.status == 206 and answer.read() == WEIGHTS[10:20]


def test_revisions_are_branches_tags_and_commits(tmp_path):
    """A file reads at a branch, a tag or a commit as it was committed there; an unknown revision is
    RevisionNotFound; commits are listed newest first."""
    with HubServer(tmp_path / "hub", token=TOKEN) as hub:
        api = HfApi(endpoint=hub.url, token=TOKEN)
        api.create_repo("alice/revs")
        first = api.upload_file(path_or_fileobj=b"1\n", path_in_repo="v.txt",
                                repo_id="alice/revs").oid
        api.create_tag("alice/revs", tag="v1")
        api.create_branch("alice/revs", branch="stable")
        api.upload_file(path_or_fileobj=b"2\n", path_in_repo="v.txt", repo_id="alice/revs")

        def read(revision: str) -> bytes:
            path = hf_hub_download("alice/revs", "v.txt", revision=revision, endpoint=hub.url)
            return Path(path).read_bytes()

        assert [read(r) for r in ("main", "v1", "stable", first)] == [b"2\n"] + [b"1\n"] * 3
        assert api.list_repo_commits("alice/revs")[1].commit_id == first
        with pytest.raises(RevisionNotFoundError):
            read("v9")


def test_visibility_changes_as_on_the_hub(tmp_path):
    """update_repo_settings makes a repo private or public, with the token only."""
    with HubServer(tmp_path / "hub", token=TOKEN) as hub:
        api, anonymous = HfApi(endpoint=hub.url, token=TOKEN), HfApi(endpoint=hub.url, token=False)
        api.create_repo("alice/vis")
        api.update_repo_settings("alice/vis", private=True)
        assert api.model_info("alice/vis").private
        with pytest.raises(RepositoryNotFoundError):
            anonymous.model_info("alice/vis")
        with pytest.raises(HfHubHTTPError) as refused:
            anonymous.update_repo_settings("alice/vis", private=False)
        assert refused.value.response.status_code == 401
        api.update_repo_settings("alice/vis", visibility="public")
        assert not anonymous.model_info("alice/vis").private


def test_the_package_imports_nothing_of_the_tests():
    """The server is test equipment: no module of vitzoo/ imports it (the wheel holds vitzoo/)."""
    import ast

    imported = set()
    for path in (ROOT / "vitzoo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert "vitzoo" in imported and not imported & {"tests", "hubserver", "hub_testing"}
