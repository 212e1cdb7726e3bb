"""A Python client of carehub's webhooks, written from docs/WEBHOOKS.md alone: it runs a receiver
of its own (http.server on 127.0.0.1), subscribes it, publishes events, verifies every delivery
with the Standard Webhooks library (PyPI standardwebhooks), and reads the attempt log back over
REST and GraphQL with requests, checking that each first attempt recorded the status, latency
and body excerpt the receiver answered.

    python attemptlog.py NODE_URL API_KEY PROJECT_ID

The key needs admin:org (subscriptions, the attempt log) and may publish events. Prints one line
per check, "PASS name" or "FAIL name: detail", then "N passed, N failed"; exits 1 on any failure.
e2e/pyclient's TestPythonAttemptLog runs it against a whole node.
"""

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

# What the receiver answers to the event whose payload has {"answer": i}: status, body, and how
# long it waits before answering. Bodies are each sent whole; the attempt log keeps the first KiB.
PLAN = [
    {"status": 200, "body": b"ok py-0", "delay": 0.0},
    {"status": 201, "body": b'{"received": true, "by": "py-1"}', "delay": 0.4},
    {"status": 500, "body": b"boom py-2", "delay": 0.0},
    {"status": 404, "body": "nicht gefunden \u2013 \u00fc \U0001f691 py-3".encode(), "delay": 0.0},
    {"status": 200, "body": b"py-4:" + b"x" * 3000, "delay": 0.0},
]
EXCERPT = 1024  # bytes of an answer the attempt log keeps (docs/WEBHOOKS.md: "the first KiB")
ATTEMPT_TIMEOUT_MS = 15000  # docs/LIMITS.md
PATIENCE = 90  # seconds to wait for what takes a second or two
EVENT_TYPE = "pyclient.attempt_probe"

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append(ok)
    print(("PASS " + name) if ok else ("FAIL %s: %s" % (name, detail)), flush=True)
    return ok


class Receiver:
    """A webhook endpoint on 127.0.0.1 that keeps every request and answers by PLAN."""

    def __init__(self):
        self.secret = None
        self.lock = threading.Lock()
        self.requests = []  # (headers with lower-case names, raw body, answer index or None)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                answer = None
                try:
                    event = json.loads(body)
                    answer = event["payload"]["answer"]
                except (ValueError, KeyError, TypeError):
                    pass
                with receiver.lock:
                    receiver.requests.append((headers, body, answer))
                plan = PLAN[answer] if isinstance(answer, int) and 0 <= answer < len(PLAN) else {
                    "status": 400, "body": b"unexpected", "delay": 0.0}
                time.sleep(plan["delay"])
                self.send_response(plan["status"])
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(plan["body"])))
                self.end_headers()
                self.wfile.write(plan["body"])

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d/hook" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def received(self):
        with self.lock:
            return list(self.requests)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def wait(what, cond):
    deadline = time.time() + PATIENCE
    while time.time() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError("waited %ds for %s" % (PATIENCE, what))


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    base, key, project = sys.argv[1].rstrip("/"), sys.argv[2], sys.argv[3]
    http = requests.Session()
    http.headers["Authorization"] = "Bearer " + key

    receiver = Receiver()
    try:
        run(http, base, project, receiver)
    except Exception as e:  # a failed step ends the run; what passed so far is printed
        check("run", False, "%s: %s" % (type(e).__name__, e))
    finally:
        receiver.close()
    failed = RESULTS.count(False)
    print("%d passed, %d failed" % (len(RESULTS) - failed, failed))
    return 1 if failed else 0


def run(http, base, project, receiver):
    r = http.post(base + "/v1/webhooks", json={"projectId": project, "url": receiver.url, "events": ["pyclient.*"]})
    hook = r.json()
    if not check("create subscription", r.status_code == 201 and hook.get("secret", "").startswith("whsec_"),
                 "%d %s" % (r.status_code, r.text[:300])):
        return
    receiver.secret = hook["secret"]
    wh = Webhook(hook["secret"])

    events = [{"projectId": project, "type": EVENT_TYPE, "payload": {"answer": i}} for i in range(len(PLAN))]
    r = http.post(base + "/v1/events", json=events)
    published = [e["id"] for e in r.json().get("data", [])] if r.status_code == 202 else []
    if not check("publish events", len(published) == len(PLAN), "%d %s" % (r.status_code, r.text[:300])):
        return
    answer_of = {ev_id: i for i, ev_id in enumerate(published)}

    # Every event reaches the receiver; every request verifies with standardwebhooks.
    wait("every event delivered", lambda: set(published) <= {h.get("webhook-id") for h, _, _ in receiver.received()})
    for headers, body, answer in receiver.received():
        name = "verify delivery %s (answer %s)" % (headers.get("webhook-id"), answer)
        try:
            event = wh.verify(body, headers)
        except WebhookVerificationError as e:
            check(name, False, "standardwebhooks refused it: %s" % e)
            continue
        ev_id = headers.get("webhook-id")
        check(name, ev_id in answer_of and event.get("event") == EVENT_TYPE and
              event.get("payload", {}).get("answer") == answer_of.get(ev_id) and event.get("project_id") == project,
              "body %s" % body[:300])
        # A verifier that accepts anything proves nothing: the same request, one byte changed.
        try:
            wh.verify(body.replace(b'"answer"', b'"answeR"', 1), headers)
            check(name + ": tampered body refused", False, "verified")
        except WebhookVerificationError:
            check(name + ": tampered body refused", True)

    # The attempt log over REST: each delivery's first attempt is the receiver's answer.
    def listed():
        r = http.get(base + "/v1/webhooks/%s/deliveries" % hook["id"], params={"limit": 100})
        r.raise_for_status()
        ds = r.json()["data"]
        done = {d["eventId"]: d for d in ds if d["attemptCount"] >= 1}
        return ds if set(published) <= set(done) else None

    deliveries = wait("every delivery attempted", listed)
    check("REST: one delivery per event", sorted(d["eventId"] for d in deliveries) == sorted(published),
          "%s" % [d["eventId"] for d in deliveries])
    rest = {}
    for d in deliveries:
        r = http.get(base + "/v1/webhooks/deliveries/" + d["id"])
        r.raise_for_status()
        rest[d["eventId"]] = r.json()

    first_bodies = {}
    for headers, body, _ in receiver.received():
        first_bodies.setdefault(headers.get("webhook-id"), body)
    for ev_id, d in rest.items():
        plan = PLAN[answer_of[ev_id]]
        name = "REST attempt log of %s (answer %d)" % (ev_id, answer_of[ev_id])
        attempts = d.get("attempts") or []
        if not check(name + ": attempts", len(attempts) >= 1 and len(attempts) == d["attemptCount"],
                     "attemptCount %s, %d attempts" % (d["attemptCount"], len(attempts))):
            continue
        check_attempt(name, attempts[0], plan)
        check(name + ": body sent", json.loads(first_bodies[ev_id]) == d.get("body"),
              "log %s, received %s" % (json.dumps(d.get("body"))[:200], first_bodies[ev_id][:200]))
        want = "succeeded" if 200 <= plan["status"] < 300 else ("pending", "failed")
        check(name + ": status", d["status"] == want or d["status"] in want, "%s, want %s" % (d["status"], want))

    # The same log over GraphQL.
    query = """query($id: ID!) { webhookDeliveries(webhookId: $id, limit: 100) {
        id eventId status attemptCount attempts { id statusCode latencyMs error responseBody attemptedAt } } }"""
    r = http.post(base + "/graphql", json={"query": query, "variables": {"id": hook["id"]}})
    out = r.json()
    if not check("GraphQL webhookDeliveries", r.status_code == 200 and not out.get("errors"),
                 "%d %s" % (r.status_code, r.text[:300])):
        return
    gql = {d["eventId"]: d for d in out["data"]["webhookDeliveries"]}
    for ev_id, d in rest.items():
        name = "GraphQL attempt log of %s (answer %d)" % (ev_id, answer_of[ev_id])
        g = gql.get(ev_id)
        if not check(name + ": listed", g is not None and g["id"] == d["id"], "not listed"):
            continue
        if not check(name + ": attempts", len(g["attempts"]) >= 1, "none"):
            continue
        check_attempt(name, g["attempts"][0], PLAN[answer_of[ev_id]])
        # Retries may have been made between the two reads: compare the attempts REST listed.
        same = all(all(ga.get(k) == ra.get(k) for k in ("id", "statusCode", "latencyMs", "error", "responseBody"))
                   for ga, ra in zip(g["attempts"], d["attempts"]))
        check(name + ": same as REST", same and len(g["attempts"]) >= len(d["attempts"]),
              "GraphQL %s, REST %s" % (g["attempts"][:2], d["attempts"][:2]))


def check_attempt(name, a, plan):
    check(name + ": status code", a.get("statusCode") == plan["status"], "%s, answered %d" % (a.get("statusCode"), plan["status"]))
    want = plan["body"][:EXCERPT].decode("utf-8")
    check(name + ": body excerpt", a.get("responseBody") == want,
          "%r, answered %r" % ((a.get("responseBody") or "")[:80], want[:80]))
    latency = a.get("latencyMs")
    check(name + ": latency", isinstance(latency, int) and plan["delay"] * 1000 <= latency < ATTEMPT_TIMEOUT_MS,
          "%s ms, the receiver waited %d ms" % (latency, plan["delay"] * 1000))
    ok = 200 <= plan["status"] < 300
    err = a.get("error")
    check(name + ": error", err is None if ok else isinstance(err, str) and str(plan["status"]) in err,
          "%r for a %d answer" % (err, plan["status"]))


if __name__ == "__main__":
    sys.exit(main())
