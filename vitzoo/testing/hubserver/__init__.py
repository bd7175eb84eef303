"""A Hugging Face Hub-compatible HTTP server, for air-gapped work and hermetic tests.

No machine of this project reaches huggingface.co, so `push_to_hub` / `from_pretrained` are exercised
against this server, driven by the real `huggingface_hub` client over real HTTP. It implements the
subset of the Hub API that the client's upload and download paths use: repo create, validate-yaml,
preupload, the git-LFS batch / upload / verify protocol, NDJSON commits, repo info, tree listing, refs,
commits, branches, tags, and `resolve` downloads. The URL of each endpoint is in `handler.py` (its
routing tables), and `tests/test_hubserver.py` is the specification of the answers, checked with the
real client (raw HTTP where the client cannot express a request). Standard library only.

Run it::

    python -m vitzoo.testing.hubserver --root ~/.cache/vitzoo-hub --port 0 --token secret
    # first stdout line: http://127.0.0.1:43817

and point the client at it, *before* `huggingface_hub` is imported (it reads these at import)::

    export HF_ENDPOINT=http://127.0.0.1:43817
    export HF_HUB_DISABLE_XET=1      # uploads would otherwise go through Xet storage, which this server lacks
    export HF_TOKEN=secret           # writes and private repos need it
    export HF_HOME=/tmp/hf-home      # optional: a cache that does not mix with the real Hub's

or, in-process, pass `endpoint=server.url` to `HfApi(...)`, `hf_hub_download(...)` and
`snapshot_download(...)`::

    with HubServer(tmp_path / "hub", token="secret") as server:
        HfApi(endpoint=server.url, token="secret").create_repo("alice/vit-b16")

Behaviour worth knowing:

- Repositories live on disk under ``--root`` and survive a restart. Every commit is an immutable JSON
  manifest (path -> content address) under ``repos/<type>/<ns>/<name>/commits/<sha>.json``; file
  contents are stored once, content-addressed by sha256, under ``blobs/``; branches, tags and PR refs
  live in ``refs.json``. All state files are written to a temporary file and `os.replace`d.
- A new repo gets an initial commit holding a ``.gitattributes``, as on the real Hub, so ``main``
  always resolves.
- Upload mode rule (preupload): a file goes to LFS when it is at least 10 MiB, when its 512-byte sample
  is not UTF-8 text (has a NUL byte or invalid UTF-8), or when a ``filter=lfs`` pattern of the
  ``.gitattributes`` at that revision matches its path. Empty files are always regular.
- Auth: with ``--token T``, writes need ``Authorization: Bearer T``; private repos need it to be read.
  A request carrying any *other* bearer token is refused with 401, even on a public repo, as the real
  Hub does: make sure no stale ``HF_TOKEN`` or stored token is sent. Without ``--token`` the server is
  open (any or no token is accepted).
- LFS upload URLs are signed and expire after an hour, like the Hub's presigned storage URLs, because
  the client sends its ``PUT`` without an ``Authorization`` header.
- Not implemented: Xet storage (``xet-*-token`` endpoints answer 501), LFS downloads through the batch
  API, pagination (every listing is one page), ``expand=`` extra properties, ``.gitignore``.

Modules, from the bottom up: `model` (repo keys, commits, errors, path rules), `store` (`HubStore`:
repos on disk, a new one with the Hub's .gitattributes), `lfs` (upload-mode rule, signed upload URLs,
batch answers), `documents` (the JSON answers and the NDJSON commit payload), `transport` (HTTP
plumbing and the threaded server), `handler` (routing and endpoints), `server` (`HubServer`) and
`cli` (`main`, behind ``python -m``).
"""

from .cli import main
from .lfs import LFS_SIZE_THRESHOLD
from .model import ErrorAnswer, RepoKey, git_blob_sha1
from .server import HubServer
from .store import HubStore

__all__ = ["LFS_SIZE_THRESHOLD", "ErrorAnswer", "HubServer", "HubStore", "RepoKey", "git_blob_sha1", "main"]
