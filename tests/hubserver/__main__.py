"""`python -m tests.hubserver --root DIR --port 0 --token T [--user U]`: serve until SIGINT or
SIGTERM; the first line printed is the URL."""

import argparse
import signal

from tests.hubserver import HubServer

parser = argparse.ArgumentParser(prog="python -m tests.hubserver", description=__doc__)
parser.add_argument("--root", required=True, help="the directory of the repos (made if missing)")
parser.add_argument("--port", type=int, default=0, help="the port; 0 (the default): a free one")
parser.add_argument("--token", help="the bearer token that writes and private repos need")
parser.add_argument("--user", default="user", help="the namespace of repos created without one")
args = parser.parse_args()
signal.signal(signal.SIGTERM, signal.default_int_handler)  # stops as SIGINT does
with HubServer(args.root, token=args.token, port=args.port, user=args.user) as server:
    print(server.url, flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
