"""A stand-in for ``python -m vllm.entrypoints.openai.api_server``: binds ``--host``/``--port``
like vLLM does, then behaves as ``$FAKE_VLLM_MODE`` says:

- ``hang``: never answers ``/health`` (it never listens);
- anything else: exits 1 with the traceback line vLLM prints for an error.
A port that is taken fails the bind with vLLM's ``OSError: [Errno 98] Address already in use``.
"""

import os
import socket
import sys
import time


def main() -> int:
    args = sys.argv[1:]
    host = args[args.index("--host") + 1]
    port = int(args[args.index("--port") + 1])
    print(f"fake vllm: args {args}", flush=True)
    sock = socket.socket()
    try:
        sock.bind((host, port))
    except OSError as e:
        print("Traceback (most recent call last):", flush=True)
        print(f"OSError: {e}", flush=True)
        return 1
    mode = os.environ.get("FAKE_VLLM_MODE", "hang")
    if mode == "hang":
        time.sleep(3600)
        return 0
    print(f"ValueError: {mode}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
