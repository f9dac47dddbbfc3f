"""A local OpenAI-compatible chat-completions server that answers from a script (for tests).

    python scripted_llm_server.py PORT SCRIPT.json REQUEST_LOG.jsonl

SCRIPT.json is a list; each request takes the next item (the last repeats):
  {"content": "..."}          a 200 answer with that message content
  {"status": 500}             an HTTP error
  {"sleep": 3, "content": ""} answers after a delay (to test client timeouts)
Every request body is appended to REQUEST_LOG.jsonl. Binds 127.0.0.1 only.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT, SCRIPT, LOG = int(sys.argv[1]), sys.argv[2], sys.argv[3]
ITEMS = json.load(open(SCRIPT))
LOCK = threading.Lock()
STATE = {"next": 0}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)) or 0)
        with LOCK:
            item = ITEMS[min(STATE["next"], len(ITEMS) - 1)]
            STATE["next"] += 1
            with open(LOG, "a") as log:
                log.write(json.dumps({"path": self.path, "body": json.loads(body or b"{}")}) + "\n")
        if "sleep" in item:
            time.sleep(item["sleep"])
        if "status" in item:
            self.send_response(item["status"])
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": {"message": "scripted failure"}}')
            return
        answer = {"id": "chatcmpl-test", "object": "chat.completion", "created": int(time.time()), "model": "scripted",
                  "choices": [{"index": 0, "finish_reason": "stop",
                               "message": {"role": "assistant", "content": item.get("content", "")}}],
                  "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", PORT), Handler)
    print("ready", flush=True)
    server.serve_forever()
