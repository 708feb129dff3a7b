#!/usr/bin/env python3
"""Warren's AMQP 0-9-1 front against a real third-party client: pika.

Usage: pika_compat.py AMQP_URL

Each check declares what it needs (names prefixed pika-compat-), runs
against the broker at AMQP_URL and asserts what RabbitMQ would give. Prints
one line per check and exits non-zero if any failed.
"""
import sys
import time
import traceback

import pika
from pika.exceptions import ChannelClosedByBroker, ConnectionClosedByBroker

URL = sys.argv[1] if len(sys.argv) > 1 else "amqp://guest:guest@127.0.0.1:5672/"
P = "pika-compat-"


def connect():
    return pika.BlockingConnection(pika.URLParameters(URL))


def drain(ch, queue, n, auto_ack=False, timeout=10):
    """Consume n messages from queue (basic.consume), return them."""
    got = []
    for method, props, body in ch.consume(queue, auto_ack=auto_ack, inactivity_timeout=timeout):
        if method is None:
            raise AssertionError("timed out after %d of %d deliveries from %s" % (len(got), n, queue))
        got.append((method, props, body))
        if len(got) == n:
            break
    return got


def check_declare_bind_confirm_consume(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    ch.exchange_declare(P + "topic", "topic", auto_delete=True)
    q = ch.queue_declare("", exclusive=True).method.queue
    assert q.startswith("amq.gen-") or q, "server-named queue has no name"
    ch.queue_bind(q, P + "topic", "a.*")
    for i in range(3):
        ch.basic_publish(P + "topic", "a.%d" % i, b"m%d" % i,
                         pika.BasicProperties(content_type="text/plain", headers={"i": i, "s": "x"}, delivery_mode=2))
    ch.basic_publish(P + "topic", "b.x", b"unrouted")  # no binding: dropped
    got = drain(ch, q, 3)
    bodies = [b for _, _, b in got]
    assert bodies == [b"m0", b"m1", b"m2"], bodies
    for i, (m, p, _) in enumerate(got):
        assert p.content_type == "text/plain" and p.headers == {"i": i, "s": "x"} and p.delivery_mode == 2, p
        ch.basic_ack(m.delivery_tag)
    ch.cancel()
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.close()


def check_mandatory_return(conn):
    ch = conn.channel()
    ch.confirm_delivery()
    try:
        ch.basic_publish("", P + "nowhere", b"r", mandatory=True)
    except pika.exceptions.UnroutableError:
        pass
    else:
        raise AssertionError("an unroutable mandatory publish was not returned")
    ch.close()


def check_nack_reject_requeue(conn):
    ch = conn.channel()
    q = ch.queue_declare(P + "nack", auto_delete=False).method.queue
    ch.queue_purge(q)
    ch.basic_publish("", q, b"x")
    (m, p, _), = drain(ch, q, 1)
    assert not m.redelivered
    ch.basic_nack(m.delivery_tag, requeue=True)
    (m, p, _), = drain(ch, q, 1)
    assert m.redelivered, "a nacked, requeued message is not marked redelivered"
    assert p.headers and p.headers.get("x-delivery-count") == 1, p.headers
    ch.basic_reject(m.delivery_tag, requeue=False)  # dropped: no dead-letter exchange
    ch.cancel()
    assert ch.queue_declare(q, passive=True).method.message_count == 0
    ch.queue_delete(q)
    ch.close()


def check_get(conn):
    ch = conn.channel()
    q = ch.queue_declare(P + "get").method.queue
    ch.queue_purge(q)
    m, _, _ = ch.basic_get(q)
    assert m is None, "basic.get on an empty queue answered get-ok"
    ch.basic_publish("", q, b"g1")
    ch.basic_publish("", q, b"g2")
    ch.confirm_delivery()
    ch.basic_publish("", q, b"g3")
    m, _, body = ch.basic_get(q)
    assert body == b"g1" and m.message_count == 2, (body, m.message_count)
    ch.basic_ack(m.delivery_tag)
    m, _, body = ch.basic_get(q, auto_ack=True)
    assert body == b"g2", body
    assert ch.queue_delete(q).method.message_count == 1
    ch.close()


def check_dead_letter(conn):
    ch = conn.channel()
    ch.exchange_declare(P + "dlx", "fanout", auto_delete=True)
    dl = ch.queue_declare(P + "dead").method.queue
    ch.queue_purge(dl)
    ch.queue_bind(dl, P + "dlx")
    q = ch.queue_declare(P + "live", arguments={"x-dead-letter-exchange": P + "dlx"}).method.queue
    ch.queue_purge(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"d")
    (m, _, _), = drain(ch, q, 1)
    ch.basic_reject(m.delivery_tag, requeue=False)
    ch.cancel()
    (m, p, body), = drain(ch, dl, 1)
    assert body == b"d", body
    death = p.headers["x-death"][0]
    assert death["queue"] == q and death["reason"] == "rejected" and death["count"] == 1, death
    assert p.headers["x-first-death-queue"] == q, p.headers
    ch.basic_ack(m.delivery_tag)
    ch.cancel()
    ch.queue_delete(q)
    ch.queue_delete(dl)
    ch.close()


def check_priorities(conn):
    ch = conn.channel()
    q = ch.queue_declare(P + "prio", arguments={"x-max-priority": 10}).method.queue
    ch.queue_purge(q)
    ch.confirm_delivery()
    for prio in (1, 9, 5):
        ch.basic_publish("", q, b"p%d" % prio, pika.BasicProperties(priority=prio))
    got = [b for _, _, b in drain(ch, q, 3, auto_ack=True)]
    assert got == [b"p9", b"p5", b"p1"], got
    ch.cancel()
    ch.queue_delete(q)
    ch.close()


def check_recover(conn):
    ch = conn.channel()
    q = ch.queue_declare(P + "recover").method.queue
    ch.queue_purge(q)
    ch.confirm_delivery()
    ch.basic_publish("", q, b"r1")
    ch.basic_publish("", q, b"r2")
    seen = []
    ch.basic_consume(q, lambda c, m, p, b: seen.append((m, b)))
    deadline = time.time() + 10
    while len(seen) < 2 and time.time() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert [b for _, b in seen] == [b"r1", b"r2"] and not any(m.redelivered for m, _ in seen), seen
    ch.basic_recover(requeue=True)
    while len(seen) < 4 and time.time() < deadline:
        conn.process_data_events(time_limit=0.1)
    again = seen[2:]
    assert sorted(b for _, b in again) == [b"r1", b"r2"] and all(m.redelivered for m, _ in again), again
    for m, _ in again:
        ch.basic_ack(m.delivery_tag)
    ch.close()
    ch = conn.channel()
    assert ch.queue_delete(q).method.message_count == 0
    ch.close()


def check_qos_prefetch(conn):
    ch = conn.channel()
    q = ch.queue_declare(P + "qos").method.queue
    ch.queue_purge(q)
    ch.confirm_delivery()
    for i in range(5):
        ch.basic_publish("", q, b"q%d" % i)
    ch.basic_qos(prefetch_count=2, global_qos=True)
    seen = []
    ch.basic_consume(q, lambda c, m, p, b: seen.append(m))
    deadline = time.time() + 10
    while len(seen) < 2 and time.time() < deadline:
        conn.process_data_events(time_limit=0.1)
    # A passive declare on the channel is answered after what was handed
    # to it: no third delivery may be among them.
    ch.queue_declare(q, passive=True)
    conn.process_data_events(time_limit=0)
    assert len(seen) == 2, "%d unacked deliveries under a prefetch of 2" % len(seen)
    ch.basic_ack(seen[1].delivery_tag, multiple=True)
    while len(seen) < 4 and time.time() < deadline:
        conn.process_data_events(time_limit=0.1)
    assert len(seen) == 4, len(seen)
    ch.close()
    ch = conn.channel()
    ch.queue_delete(q)
    ch.close()


def check_errors(conn):
    ch = conn.channel()
    try:
        ch.queue_declare(P + "missing", passive=True)
    except ChannelClosedByBroker as e:
        assert e.reply_code == 404, e
    else:
        raise AssertionError("passive declare of a missing queue succeeded")
    ch = conn.channel()
    try:
        ch.queue_declare(P + "bad", arguments={"x-queue-type": "stream"})
    except ChannelClosedByBroker as e:
        assert e.reply_code == 406, e
    else:
        raise AssertionError("an x-queue-type stream queue was declared")
    ch = conn.channel()
    ch.queue_declare(P + "quorum", durable=True, arguments={"x-queue-type": "quorum"})
    ch.queue_delete(P + "quorum")
    ch.close()


def check_tx(conn):
    ch = conn.channel()
    q = P + "tx"
    ch.queue_declare(q, auto_delete=True)
    ch.tx_select()
    ch.basic_publish("", q, b"kept")
    ch.tx_commit()
    ch.basic_publish("", q, b"dropped")
    ch.tx_rollback()
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert method is not None and body == b"kept", (method, body)
    method, _, body = ch.basic_get(q, auto_ack=True)
    assert method is None, ("the rolled back publish was delivered", body)
    ch.close()


CHECKS = [check_declare_bind_confirm_consume, check_mandatory_return, check_nack_reject_requeue, check_get,
          check_dead_letter, check_priorities, check_recover, check_qos_prefetch, check_errors, check_tx]


def main():
    failed = 0
    conn = connect()
    for check in CHECKS:
        name = check.__name__[len("check_"):]
        try:
            if conn.is_closed:
                conn = connect()
            check(conn)
            print("ok   pika %s %s" % (pika.__version__, name))
        except Exception:
            failed += 1
            print("FAIL pika %s %s\n%s" % (pika.__version__, name, traceback.format_exc()))
    if conn.is_open:
        conn.close()
    print("pika: %d of %d checks passed" % (len(CHECKS) - failed, len(CHECKS)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
