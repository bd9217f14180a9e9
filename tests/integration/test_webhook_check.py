"""Check-back over HTTP (TxProducerGroup checkMode http): the broker asks a webhook, not a producer."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from support.waiting import wait_until
from support import txload
from txbroker.client import LocalTransactionState as S, Message, TransactionListener, TransactionProducer
from txbroker.client.admin import AdminClient, AdminError


class Webhook:
    """A check-back endpoint: answers per order body, records what it was asked."""

    def __init__(self, answers: dict[str, object]):
        self.answers = answers
        self.asked: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                doc = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                hook.asked.append(doc)

                body = base64.b64decode(doc["message"]["body"]).decode()
                answer = hook.answers.get(body, "UNKNOWN")
                status, payload = (500, b"boom") if answer == 500 else (200, json.dumps({"state": answer}).encode())
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/check"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def webhook():
    hooks = []

    def make(answers):
        hooks.append(Webhook(answers))
        return hooks[-1]
    yield make
    for h in hooks:
        h.close()


class LeaveItOpen(TransactionListener):
    def execute_local_transaction(self, msg, arg):
        return S.UNKNOWN

    def check_local_transaction(self, msg):   # never asked: the group is checked through the webhook
        raise AssertionError("a producer connection was checked although the group has a webhook")


def test_webhook_answers_decide_pending_transactions(broker, webhook):
    hook = webhook({"pay-commit": "COMMIT", "pay-rollback": "ROLLBACK", "pay-unknown": "UNKNOWN",
                    "pay-error": 500})
    admin = AdminClient(broker.admin_url)
    admin.put("/api/v1/groups/payments/transaction", {"webhook_url": hook.url, "check_interval_ms": 300,
                                                      "timeout_ms": 200, "check_max": 3, "generation": 1})
    with TransactionProducer("payments", broker.address, LeaveItOpen()) as p:
        txids = {body: p.send_message_in_transaction(Message("Payments", body.encode()), None).transaction_id
                 for body in ("pay-commit", "pay-rollback", "pay-unknown", "pay-error")}

        def state(body):
            doc = admin.get(f"/api/v1/transactions/{txids[body]}")
            return doc.get("state")
        wait_until(lambda: state("pay-commit") == "COMMITTED" and state("pay-rollback") == "ROLLED_BACK", 15,
                   what="the webhook's COMMIT and ROLLBACK applied")
        assert txload.visible(broker.address, "Payments") == {"pay-commit": 1}
        # UNKNOWN and errors leave it pending; each try counts, so both end parked after check_max
        wait_until(lambda: state("pay-unknown") == "PARKED" and state("pay-error") == "PARKED", 15,
                   what="undecided transactions parked after check_max webhook checks")
    asked = [d for d in hook.asked if d["transaction_id"] == txids["pay-commit"]]
    assert asked and asked[0]["producer_group"] == "payments" and asked[0]["message"]["topic"] == "Payments"
    assert len([d for d in hook.asked if d["transaction_id"] == txids["pay-unknown"]]) == 3


def test_webhook_url_must_be_http(broker):
    with pytest.raises(AdminError) as e:
        AdminClient(broker.admin_url).put("/api/v1/groups/g/transaction", {"webhook_url": "ftp://x"})
    assert "webhook_url must be an http:// or https:// URL" in str(e.value)
