"""`python -m tests.hubserver --root DIR --port 0 --token T [--user U]`: serve until SIGINT or
SIGTERM; the first line printed is the URL."""

import argparse
import signal
import threading

from tests.hubserver import HubServer

parser = argparse.ArgumentParser(prog="python -m tests.hubserver", description=__doc__)
parser.add_argument("--root", required=True, help="the directory of the repos (made if missing)")
parser.add_argument("--port", type=int, default=0, help="the port; 0 (the default): a free one")
parser.add_argument("--token", default=None, help="the bearer token writes and private reads need")
parser.add_argument("--user", default="user", help="the namespace of repos created without one")
args = parser.parse_args()
stopping = threading.Event()
for signum in (signal.SIGINT, signal.SIGTERM):
    signal.signal(signum, lambda *_: stopping.set())
with HubServer(args.root, token=args.token, port=args.port, username=args.user) as server:
    print(server.url, flush=True)
    stopping.wait()
