#!/usr/bin/env python3
"""A local webhook sink for leasegate's device alerts: prints every notification it receives, and
drops repeats of an Idempotency-Key it has seen (as a receiver should).

Usage: scripts/webhook_sink.py [PORT]   (default 3001, listens on 127.0.0.1 only)

It writes no file: what it receives goes to stdout.
"""
import argparse
import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


SEEN = set()


class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        length = min(int(self.headers.get("content-length") or 0), 1 << 20)
        body = self.rfile.read(length)
        try:
            shown = json.dumps(json.loads(body), ensure_ascii=False)
        except ValueError:
            shown = body.decode("utf-8", "replace")
        key = self.headers.get("idempotency-key")
        if key and key in SEEN:
            print(f"repeat of {key} dropped", flush=True)
        else:
            SEEN.add(key)
            print(f"notification {self.path} (idempotency key {key}): {shown}", flush=True)
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description="A local webhook sink: prints every notification it receives (to stdout, "
                    "no file written) and drops repeats of an Idempotency-Key.",
    )
    parser.add_argument("port", nargs="?", type=int, default=3001,
                        help="the port to listen on, on 127.0.0.1 only (default 3001)")
    port = parser.parse_args().port
    server = ThreadingHTTPServer(("127.0.0.1", port), Sink)
    print(f"webhook sink on http://127.0.0.1:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
