"""The test Hub (tests/hubserver) as the real huggingface_hub client sees it; its token and
revisions are tested through vitzoo's calls (tests/test_hub.py, tests/test_hub_errors.py)."""

from __future__ import annotations

import ast
import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download
from hub_testing import TOKEN  # tests/hub_testing.py
from hubserver import HubServer, git_blob_sha1

pytestmark = pytest.mark.usefixtures("hermetic_hub")  # tests/conftest.py
ROOT = Path(__file__).resolve().parents[1]


def test_the_command_line_prints_the_url_first_and_repos_outlive_the_server(tmp_path):
    def started() -> tuple[subprocess.Popen, str]:
        command = [sys.executable, "-m", "tests.hubserver", "--root", str(tmp_path / "hub"),
                   "--port", "0", "--token", TOKEN, "--user", "bob"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        return process, process.stdout.readline().strip()

    process, url = started()
    try:
        assert url.startswith("http://127.0.0.1:") and url.rsplit(":", 1)[1].isdigit()
        api = HfApi(endpoint=url, token=TOKEN)
        assert api.create_repo("kept").endswith("/bob/kept")  # --user: a bare name's namespace
        api.upload_file(path_or_fileobj=b"hello\n", path_in_repo="a.txt", repo_id="bob/kept")
    finally:
        process.terminate()
        assert process.wait(10) == 0
    process, url = started()
    try:
        assert Path(hf_hub_download("bob/kept", "a.txt", endpoint=url)).read_bytes() == b"hello\n"
    finally:
        process.terminate()
        process.wait(10)


def test_files_are_named_by_the_hashes_the_hub_gives_them(tmp_path):
    """A binary file is an LFS file, redirected to its blob and named by its sha256; a text file
    is named by its git blob sha1. The Hugging Face cache names its blobs so."""
    weights = bytes(range(256)) * 64
    with HubServer(tmp_path / "hub", token=TOKEN) as hub:
        api = HfApi(endpoint=hub.url, token=TOKEN)
        api.create_repo("alice/files")
        for name, data in (("model.safetensors", weights), ("config.json", b"{}\n")):
            api.upload_file(path_or_fileobj=data, path_in_repo=name, repo_id="alice/files")
        blob = Path(hf_hub_download("alice/files", "model.safetensors", endpoint=hub.url)).resolve()
        assert blob.name == hashlib.sha256(weights).hexdigest() and blob.read_bytes() == weights
        config = Path(hf_hub_download("alice/files", "config.json", endpoint=hub.url)).resolve()
        assert config.name == git_blob_sha1(b"{}\n")


def test_the_package_imports_nothing_of_the_tests():
    """The server is test equipment: no module of vitzoo/ imports it (the wheel holds vitzoo/)."""
    imported = set()
    for path in (ROOT / "vitzoo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                imported.add(node.module.split(".")[0])
    assert "vitzoo" in imported and not imported & {"tests", "hubserver", "hub_testing"}
