#!/usr/bin/env python3
"""A minimal Warren client in Python 3, standard library only, written from spec/PROTOCOL.md alone.

It is an example for client authors, and a check that the spec is enough: it speaks the native protocol v1
(section numbers below are PROTOCOL.md's) and runs a scenario against a live broker, exiting non-zero on the
first thing that does not behave as the spec says.

Run it against a broker on loopback (guest/guest is accepted from loopback only):

    make build && bin/warrend --listen 127.0.0.1:5680 --http 127.0.0.1:15680 --data "$(mktemp -d)" &
    python3 spec/examples/minimal_client.py --addr 127.0.0.1:5680

or let make do all of it: `make spec-client-check`. Options: --user, --password, --vectors DIR (default: the
spec/vectors next to this file; checks the encoder and decoder against the byte-exact vectors first), -v.

What it covers: preamble, HELLO/AUTH (PLAIN)/OPEN_OK and limit negotiation; heartbeats (it asks for a short
interval, keeps the connection alive through a quiet spell and sees the broker's heartbeats, then checks that a
silent client is closed with heartbeat_timeout); channels and requests (req matching, OK/ERROR); an exchange,
durable queues with a dead-letter exchange, bindings; persistent publishing in batches with publisher confirms
(ranges matched to sequence numbers, a nack for a missing exchange, a mandatory RETURN before its ack); consuming
with a prefetch (never more unacked than asked), ack (single and "multiple"), requeue (redelivered flag and
counters), reject to the dead-letter exchange (the `deaths` property); cancel; channel close (with confirms still
owed: they come first) and reuse of the id; connection close (also before OPEN_OK); and
deliberately bad input (bad preamble, unknown frame type, ignorable extension type, oversize length, truncated
payload, bad flags, wrong channel, unopened channel, bad credentials, unknown delivery tag, sequence gap),
each checked against the error code and the closing behaviour the spec names.

What it leaves out: compression (§11), TLS (§5.7), vhosts (§5.2.1), flow control (§8.4, it only logs FLOW),
lease extension (§9.4). A real client would also run its reader on its own thread; this one reads only while it
waits for something, which is enough for heartbeats here because it never waits without reading.
"""

import argparse
import base64
import json
import os
import select
import socket
import struct
import sys
import time
import uuid

# ---------------------------------------------------------------------------------------------------------------
# Constants (§4, §12)

HELLO, AUTH, AUTH_CHALLENGE, AUTH_RESPONSE, OPEN_OK, HEARTBEAT, CLOSE, CLOSE_OK = range(1, 9)
CHANNEL_OPEN, CHANNEL_CLOSE, CHANNEL_CLOSE_OK, OK, ERROR = 0x10, 0x11, 0x12, 0x13, 0x14
EXCHANGE_DECLARE, EXCHANGE_DELETE, QUEUE_DECLARE, QUEUE_DECLARE_OK = 0x20, 0x21, 0x22, 0x23
QUEUE_DELETE, QUEUE_PURGE, BIND, UNBIND = 0x24, 0x25, 0x26, 0x27
PUBLISH, CONFIRM, RETURN, FLOW = 0x30, 0x31, 0x32, 0x33
SUBSCRIBE, SUBSCRIBE_OK, CANCEL, CANCELLED, DELIVER, SETTLE, LEASE_EXPIRED = 0x40, 0x41, 0x42, 0x43, 0x44, 0x45, 0x46

FRAME_NAMES = {v: k for k, v in globals().items() if isinstance(v, int) and k.isupper() and 0 < v < 0x50}

CODES = {
    0: "ok", 100: "no_route", 101: "queue_full", 102: "exchange_not_found", 103: "internal_nack",
    104: "exchange_internal", 200: "not_found", 201: "precondition_failed", 202: "access_refused",
    203: "resource_locked", 204: "invalid_argument", 205: "not_allowed", 206: "limit_reached",
    300: "unknown_delivery_tag", 301: "sequence_error", 400: "frame_error", 401: "frame_too_large",
    402: "unknown_frame_type", 403: "bad_flags", 404: "unexpected_frame", 405: "bad_version", 406: "auth_failed",
    407: "heartbeat_timeout", 408: "decompress_error", 409: "channel_error", 410: "resource_limit",
    411: "connection_forced", 412: "internal_error",
}
CODE = {name: code for code, name in CODES.items()}

EXCHANGE_KINDS = {"direct": 1, "topic": 2, "fanout": 3, "headers": 4, "consistent-hash": 5}
SETTLE_ACK, SETTLE_REQUEUE, SETTLE_REJECT, SETTLE_EXTEND = 1, 2, 3, 4

PREAMBLE = b"WARREN\x01\x00"   # §5.1
PRE_OPEN_MAX_FRAME = 65536     # §3: the limit before OPEN_OK
HEADER = struct.Struct("<IBBH")  # §3: length u32 | type u8 | flags u8 | channel u16, all little-endian

PROPERTY_IDS = {  # §10.1
    "content_type": 1, "content_encoding": 2, "message_id": 3, "correlation_id": 4, "reply_to": 5,
    "expiration_ms": 6, "timestamp_ms": 7, "type": 8, "user_id": 9, "app_id": 10, "headers": 11, "deaths": 12,
}
PROPERTY_NAMES = {v: k for k, v in PROPERTY_IDS.items()}
DEATH_REASONS = {1: "rejected", 2: "expired", 3: "maxlen", 4: "delivery_limit"}


class ProtocolError(Exception):
    """The peer sent something this client cannot accept."""


class ConnectionClosed(Exception):
    """The broker sent CLOSE (code, reason) or the socket closed."""

    def __init__(self, code, reason):
        super().__init__(f"connection closed: {code} {CODES.get(code, '?')}: {reason}")
        self.code, self.reason = code, reason


class ChannelClosed(Exception):
    def __init__(self, channel, code, reason):
        super().__init__(f"channel {channel} closed: {code} {CODES.get(code, '?')}: {reason}")
        self.channel, self.code, self.reason = channel, code, reason


class RequestFailed(Exception):
    def __init__(self, code, message):
        super().__init__(f"request failed: {code} {CODES.get(code, '?')}: {message}")
        self.code, self.message = code, message


# ---------------------------------------------------------------------------------------------------------------
# Data types (§2) and tables (§10.2)

class Writer:
    def __init__(self):
        self.parts = []

    def u8(self, v): self.parts.append(struct.pack("<B", v)); return self
    def u16(self, v): self.parts.append(struct.pack("<H", v)); return self
    def i16(self, v): self.parts.append(struct.pack("<h", v)); return self
    def u32(self, v): self.parts.append(struct.pack("<I", v)); return self
    def u64(self, v): self.parts.append(struct.pack("<Q", v)); return self
    def i64(self, v): self.parts.append(struct.pack("<q", v)); return self
    def raw(self, b): self.parts.append(bytes(b)); return self
    def bool(self, v): return self.u8(1 if v else 0)

    def str8(self, s):
        b = s.encode() if isinstance(s, str) else bytes(s)
        if len(b) > 255:
            raise ValueError("str8 longer than 255 bytes")
        return self.u8(len(b)).raw(b)

    def str16(self, s):
        b = s.encode() if isinstance(s, str) else bytes(s)
        return self.u16(len(b)).raw(b)

    def bytes32(self, b): return self.u32(len(b)).raw(b)

    def strlist(self, items):
        items = items or []
        self.u8(len(items))
        for s in items:
            self.str8(s)
        return self

    def flags(self, *bits):
        return self.u8(sum(1 << i for i, on in enumerate(bits) if on))

    def table(self, fields):
        body = table_fields(fields)
        return self.u32(len(body)).raw(body)

    def bytes(self): return b"".join(self.parts)


def table_value(kind, value):
    """One table value: kind u8 | value. `kind` is the vectors' name for it (§10.2)."""
    w = Writer()
    if kind == "null":
        w.u8(0)
    elif kind == "bool":
        w.u8(1).bool(value)
    elif kind == "int":
        w.u8(2).i64(value)
    elif kind == "float":
        w.u8(3).raw(struct.pack("<d", value))
    elif kind == "string":
        w.u8(4).bytes32(value.encode())
    elif kind == "bytes":
        w.u8(5).bytes32(value)
    elif kind == "table":
        w.u8(6).table(value)
    elif kind == "array":
        inner = b"".join(table_value(k, v) for k, v in value)
        w.u8(7).u32(len(inner)).raw(inner)
    elif kind == "timestamp":
        w.u8(8).i64(value)
    else:
        raise ValueError(kind)
    return w.bytes()


def table_fields(fields):
    """Table fields without the u32 length: a list of (key, kind, value)."""
    return b"".join(Writer().str8(k).bytes() + table_value(kind, v) for k, kind, v in (fields or []))


class Reader:
    def __init__(self, data):
        self.data, self.pos = memoryview(data), 0

    def take(self, n):
        if self.pos + n > len(self.data):
            raise ProtocolError("truncated payload")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return bytes(b)

    def unpack(self, fmt):
        s = struct.Struct(fmt)
        return s.unpack(self.take(s.size))[0]

    def u8(self): return self.unpack("<B")
    def u16(self): return self.unpack("<H")
    def i16(self): return self.unpack("<h")
    def u32(self): return self.unpack("<I")
    def u64(self): return self.unpack("<Q")
    def i64(self): return self.unpack("<q")

    def bool(self):
        v = self.u8()
        if v > 1:
            raise ProtocolError("bool not 0 or 1")
        return v == 1

    def str8(self): return self.take(self.u8()).decode("utf-8", "replace")
    def str16(self): return self.take(self.u16()).decode("utf-8", "replace")
    def bytes32(self): return self.take(self.u32())
    def strlist(self): return [self.str8() for _ in range(self.u8())]
    def table(self): return read_table_fields(self.take(self.u32()))

    def done(self):
        if self.pos != len(self.data):  # §2: every payload is consumed exactly
            raise ProtocolError(f"{len(self.data) - self.pos} bytes left over")


def read_table_value(r, depth):
    kind = r.u8()
    if kind == 0:
        return ("null", None)
    if kind == 1:
        return ("bool", r.bool())
    if kind == 2:
        return ("int", r.i64())
    if kind == 3:
        return ("float", struct.unpack("<d", r.take(8))[0])
    if kind == 4:
        return ("string", r.bytes32().decode("utf-8", "replace"))
    if kind == 5:
        return ("bytes", r.bytes32())
    if kind == 6:
        return ("table", read_table_fields(r.bytes32(), depth + 1))
    if kind == 7:
        inner, items = Reader(r.bytes32()), []
        while inner.pos < len(inner.data):
            items.append(read_table_value(inner, depth + 1))
        return ("array", items)
    if kind == 8:
        return ("timestamp", r.i64())
    raise ProtocolError(f"unknown table kind {kind}")


def read_table_fields(data, depth=1):
    if depth > 8:
        raise ProtocolError("table nested deeper than 8 levels")
    r, fields = Reader(data), []
    while r.pos < len(r.data):
        key = r.str8()
        kind, value = read_table_value(r, depth)
        fields.append((key, kind, value))
    return fields


# ---------------------------------------------------------------------------------------------------------------
# Messages: properties (§10.1), PUBLISH (§8.1), DELIVER (§9.2)

def encode_properties(props):
    w = Writer()
    for name, value in sorted((props or {}).items(), key=lambda kv: PROPERTY_IDS[kv[0]]):  # ids ascending
        if name == "expiration_ms":
            v = struct.pack("<I", value)
        elif name == "timestamp_ms":
            v = struct.pack("<q", value)
        elif name == "headers":
            v = table_fields(value)  # without the table's u32 length
        elif name == "deaths":
            raise ValueError("deaths is written by the broker only")
        else:
            v = value.encode() if isinstance(value, str) else bytes(value)
        if not v:
            continue  # an empty property is left out (§10.1)
        w.u8(PROPERTY_IDS[name]).u16(len(v)).raw(v)
    return w.bytes()


def decode_properties(data):
    r, props = Reader(data), {}
    while r.pos < len(r.data):
        pid, value = r.u8(), r.take(r.u16())
        name = PROPERTY_NAMES.get(pid)
        if name == "expiration_ms":
            props[name] = struct.unpack("<I", value)[0]
        elif name == "timestamp_ms":
            props[name] = struct.unpack("<q", value)[0]
        elif name == "headers":
            props[name] = read_table_fields(value)
        elif name == "deaths":
            props[name] = decode_deaths(value)
        elif name is None:
            props.setdefault("unknown", []).append((pid, value))  # ids 13..255: kept, not interpreted
        else:
            props[name] = value
    return props


def decode_deaths(data):
    r, deaths = Reader(data), []
    for _ in range(r.u8()):
        deaths.append({
            "queue": r.str8(), "reason": DEATH_REASONS.get(r.u8(), "?"), "count": r.u32(), "first_ms": r.i64(),
            "last_ms": r.i64(), "exchange": r.str8(), "routing_keys": r.strlist(),
        })
    r.done()
    return deaths


def encode_message(w, routing_key, body, persistent=False, mandatory=False, priority=0, properties=None):
    props = encode_properties(properties)
    w.flags(mandatory, persistent).u8(priority).str8(routing_key).u16(len(props)).raw(props).bytes32(body)


def decode_message(r):
    flags = r.u8()
    return {"mandatory": bool(flags & 1), "persistent": bool(flags & 2), "priority": r.u8(),
            "routing_key": r.str8(), "properties": decode_properties(r.take(r.u16())), "body": r.bytes32()}


def decode_deliver(payload, codec):
    if codec:
        raise ProtocolError("compressed DELIVER, but this client did not list a compression capability")
    r = Reader(payload)
    tag, count, out = r.str8(), r.u32(), []
    for _ in range(count):
        d = {"tag": r.u64()}
        flags = r.u8()
        d.update(redelivered=bool(flags & 1), persistent=bool(flags & 2), priority=r.u8(),
                 delivery_count=r.u32(), failed_count=r.u32(), exchange=r.str8(), routing_key=r.str8(),
                 properties=decode_properties(r.take(r.u16())), body=r.bytes32())
        if d["tag"] == 0:
            raise ProtocolError("delivery tag 0")
        out.append(d)
    r.done()
    return tag, out


def decode_confirm(payload):
    r = Reader(payload)
    ranges = [(r.u64(), r.u64(), r.u16()) for _ in range(r.u16())]
    r.done()
    return ranges


def decode_return(payload):
    r = Reader(payload)
    out = []
    for _ in range(r.u32()):
        seq, code, exchange = r.u64(), r.u16(), r.str8()
        out.append((seq, code, exchange, decode_message(r)))
    r.done()
    return out


def frame(ftype, channel, payload=b"", flags=0):
    return HEADER.pack(len(payload), ftype, flags, channel) + payload


# ---------------------------------------------------------------------------------------------------------------
# The connection

class Frame:
    __slots__ = ("type", "flags", "channel", "payload")

    def __init__(self, ftype, flags, channel, payload):
        self.type, self.flags, self.channel, self.payload = ftype, flags, channel, payload

    def __repr__(self):
        return f"<{FRAME_NAMES.get(self.type, hex(self.type))} ch={self.channel} {len(self.payload)}B>"


class Connection:
    """One connection. Frames that arrive while the client waits for something else are kept in `inbox`."""

    def __init__(self, addr, verbose=False):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.inbox = []
        self.verbose = verbose
        self.max_frame = PRE_OPEN_MAX_FRAME
        self.heartbeat_ms = 0
        self.last_sent = self.last_received = time.monotonic()
        self.heartbeats_received = 0
        self.longest_silence = 0.0    # the longest wait between two frames from the broker, seconds
        self.heartbeats_sent = 0
        self.send_heartbeats = True   # off only to test the broker's heartbeat timeout
        self.closed = None            # (code, reason) once the broker closed the connection
        self.next_req = 1
        self.hello = self.open_ok = None

    # -- raw I/O --------------------------------------------------------------------------------------------

    def send_raw(self, data):
        self.sock.sendall(data)
        self.last_sent = time.monotonic()

    def send(self, ftype, channel, payload=b"", flags=0):
        if 8 + len(payload) > self.max_frame:
            raise ValueError(f"frame of {8 + len(payload)} bytes exceeds max_frame {self.max_frame}")
        if self.verbose:
            print(f"  -> {FRAME_NAMES.get(ftype, hex(ftype))} ch={channel} {len(payload)}B", file=sys.stderr)
        self.send_raw(frame(ftype, channel, payload, flags))

    def _tick(self):
        """Send a HEARTBEAT when nothing was sent for half the interval (§5.4 asks for one after H)."""
        if self.heartbeat_ms and self.send_heartbeats and self.closed is None:
            if time.monotonic() - self.last_sent >= self.heartbeat_ms / 2000:
                self.send(HEARTBEAT, 0)
                self.heartbeats_sent += 1

    def _split_frame(self):
        if len(self.buf) < 8:
            return None
        length, ftype, flags, channel = HEADER.unpack_from(self.buf)
        if 8 + length > self.max_frame:  # checked on the header, before the payload is read (§3)
            raise ProtocolError(f"frame of {8 + length} bytes exceeds max_frame {self.max_frame}")
        if len(self.buf) < 8 + length:
            return None
        payload = bytes(self.buf[8:8 + length])
        del self.buf[:8 + length]
        return Frame(ftype, flags, channel, payload)

    def read_frame(self, timeout):
        """The next frame of interest, or None at the timeout. Handles HEARTBEAT, extensions and CLOSE."""
        deadline = time.monotonic() + timeout
        while True:
            f = self._split_frame()
            if f is not None:
                now = time.monotonic()
                self.longest_silence = max(self.longest_silence, now - self.last_received)
                self.last_received = now
                if self.verbose:
                    print(f"  <- {f}", file=sys.stderr)
                if f.type == HEARTBEAT:
                    self.heartbeats_received += 1
                    continue
                if 0xE0 <= f.type <= 0xFF:  # ignorable extensions (§14)
                    continue
                if f.type == CLOSE:
                    r = Reader(f.payload)
                    code, reason = r.u16(), r.str16()
                    self.closed = (code, reason)
                    try:  # §5.5: answer CLOSE_OK; the broker may already have closed the socket
                        self.send(CLOSE_OK, 0)
                    except OSError:
                        pass
                    raise ConnectionClosed(code, reason)
                return f
            self._tick()
            now = time.monotonic()
            if now >= deadline:
                return None
            wait = deadline - now
            if self.heartbeat_ms and self.send_heartbeats:
                wait = min(wait, self.heartbeat_ms / 4000)
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                try:
                    data = self.sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if not data:
                    self.closed = self.closed or (-1, "socket closed without CLOSE")
                    raise ConnectionClosed(*self.closed)
                self.buf += data

    def socket_closed_within(self, timeout):
        """After the broker's CLOSE: True once the broker closed the socket (EOF or reset), False at the timeout."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                ready, _, _ = select.select([self.sock], [], [], deadline - time.monotonic())
                if ready and not self.sock.recv(65536):
                    return True
            return False
        except OSError:
            return True
        finally:
            self.sock.close()

    def wait_for(self, match, timeout=10.0, what="a frame"):
        """Returns the first frame (from the inbox, then the socket) for which match(frame) is true."""
        for i, f in enumerate(self.inbox):
            if match(f):
                return self.inbox.pop(i)
        deadline = time.monotonic() + timeout
        while True:
            f = self.read_frame(max(0.0, deadline - time.monotonic()))
            if f is None:
                raise TimeoutError(f"timed out waiting for {what}")
            if match(f):
                return f
            if f.type == FLOW:
                active = f.payload[:1] == b"\x01"
                print(f"  (FLOW on channel {f.channel}: active={active})", file=sys.stderr)
            self.inbox.append(f)

    def pump(self, seconds):
        """Read (and keep) frames for a while, sending heartbeats as needed."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            f = self.read_frame(deadline - time.monotonic())
            if f is not None:
                self.inbox.append(f)

    # -- handshake (§5.1 – §5.3) ----------------------------------------------------------------------------

    def handshake(self, user="guest", password="guest", heartbeat_ms=0, max_frame=0):
        self.send_raw(PREAMBLE)
        f = self.wait_for(lambda f: True, what="HELLO")
        if f.type != HELLO:
            raise ProtocolError(f"expected HELLO, got {f}")
        r = Reader(f.payload)
        self.hello = {"product": r.str8(), "version": r.str8(), "mechanisms": r.strlist(),
                      "capabilities": r.strlist(), "max_frame": r.u32(), "max_channels": r.u16(),
                      "heartbeat_ms": r.u32()}
        r.done()
        if "PLAIN" not in self.hello["mechanisms"]:
            raise ProtocolError("broker does not offer PLAIN")
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
        self.send(AUTH, 0, Writer().str8("PLAIN").bytes32(response).str8("warren-py-example").str8("0.1")
                  .strlist([]).u32(max_frame).u16(0).u32(heartbeat_ms).bytes())
        f = self.wait_for(lambda f: True, what="OPEN_OK")
        if f.type != OPEN_OK:
            raise ProtocolError(f"expected OPEN_OK, got {f}")
        r = Reader(f.payload)
        self.open_ok = {"connection_id": r.u64(), "max_frame": r.u32(), "max_channels": r.u16(),
                        "heartbeat_ms": r.u32()}
        r.done()
        self.max_frame = self.open_ok["max_frame"]
        self.heartbeat_ms = self.open_ok["heartbeat_ms"]
        return self.open_ok

    def close(self, timeout=5.0):
        """§5.5: CLOSE ok, then wait for CLOSE_OK (or a crossing CLOSE, or the socket closing)."""
        self.send(CLOSE, 0, Writer().u16(0).str16("bye").bytes())
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                f = self.read_frame(deadline - time.monotonic())
                if f is not None and f.type == CLOSE_OK:
                    break
        except ConnectionClosed:
            pass  # a crossing CLOSE or the socket closing also ends it
        self.sock.close()

    # -- channels and requests (§6) -------------------------------------------------------------------------

    def req(self):
        n = self.next_req
        self.next_req += 1
        return n

    def request(self, ftype, channel, body_after_req, replies=(OK,)):
        """Sends a request (req u32 first), waits for the reply with the same req on the channel."""
        req = self.req()
        self.send(ftype, channel, struct.pack("<I", req) + body_after_req)

        def match(f):
            if f.channel != channel:
                return False
            if f.type == CHANNEL_CLOSE:
                return True
            return f.type in replies + (ERROR,) and len(f.payload) >= 4 and \
                struct.unpack_from("<I", f.payload)[0] == req

        f = self.wait_for(match, what=f"the reply to req {req}")
        if f.type == CHANNEL_CLOSE:
            r = Reader(f.payload)
            code, reason = r.u16(), r.str16()
            self.send(CHANNEL_CLOSE_OK, channel)
            raise ChannelClosed(channel, code, reason)
        r = Reader(f.payload)
        r.u32()
        if f.type == ERROR:
            code, message = r.u16(), r.str16()
            r.done()
            raise RequestFailed(code, message)
        return f.type, r

    def open_channel(self, channel):
        _, r = self.request(CHANNEL_OPEN, channel, b"")
        r.u64()
        r.done()
        return Channel(self, channel)


class Channel:
    def __init__(self, conn, number):
        self.conn, self.number = conn, number
        self.next_seq = 1             # publish sequence numbers start at 1 per channel (§8.1)
        self.unconfirmed = set()
        self.confirms = {}            # seq -> code
        self.returns = {}             # seq -> (code, exchange, message)
        self.unacked = {}             # delivery tag -> delivery (non-auto-ack consumers)

    def _ok(self, ftype, body):
        _, r = self.conn.request(ftype, self.number, body)
        count = r.u64()
        r.done()
        return count

    def declare_exchange(self, name, kind="direct", durable=False, auto_delete=False, internal=False,
                         passive=False, alternate_exchange="", args=None):
        self._ok(EXCHANGE_DECLARE, Writer().str8(name).u8(EXCHANGE_KINDS[kind])
                 .flags(durable, auto_delete, internal, passive).str8(alternate_exchange).table(args).bytes())

    def delete_exchange(self, name, if_unused=False):
        self._ok(EXCHANGE_DELETE, Writer().str8(name).flags(if_unused).bytes())

    def declare_queue(self, name, durable=False, exclusive=False, auto_delete=False, passive=False, args=None):
        _, r = self.conn.request(QUEUE_DECLARE, self.number,
                                 Writer().str8(name).flags(durable, exclusive, auto_delete, passive)
                                 .table(args).bytes(), replies=(QUEUE_DECLARE_OK,))
        out = {"name": r.str8(), "messages": r.u64(), "consumers": r.u32()}
        r.done()
        return out

    def delete_queue(self, name, if_unused=False, if_empty=False):
        return self._ok(QUEUE_DELETE, Writer().str8(name).flags(if_unused, if_empty).bytes())

    def bind(self, destination, source, routing_key="", to_exchange=False, args=None):
        self._ok(BIND, Writer().flags(to_exchange).str8(destination).str8(source).str8(routing_key)
                 .table(args).bytes())

    def publish(self, exchange, messages):
        """One PUBLISH frame: a batch to one exchange. messages: dicts for encode_message. Returns the seqs."""
        first = self.next_seq
        w = Writer().u64(first).u32(len(messages)).str8(exchange)
        for m in messages:
            encode_message(w, **m)
        self.conn.send(PUBLISH, self.number, w.bytes())
        seqs = range(first, first + len(messages))
        self.next_seq += len(messages)
        self.unconfirmed.update(seqs)
        return list(seqs)

    def handle(self, f):
        """Applies a CONFIRM or RETURN frame of this channel."""
        if f.type == CONFIRM:
            for first, last, code in decode_confirm(f.payload):
                if not 1 <= first <= last:
                    raise ProtocolError(f"bad confirm range {first}..{last}")
                for seq in range(first, last + 1):
                    if seq not in self.unconfirmed:
                        raise ProtocolError(f"confirm for seq {seq}, which is not unconfirmed")
                    self.unconfirmed.discard(seq)
                    self.confirms[seq] = code
        elif f.type == RETURN:
            for seq, code, exchange, msg in decode_return(f.payload):
                if seq not in self.unconfirmed:
                    raise ProtocolError(f"RETURN for seq {seq} after its confirm (§8.3: before it)")
                self.returns[seq] = (code, exchange, msg)

    def wait_confirms(self, timeout=10.0):
        deadline = time.monotonic() + timeout
        while self.unconfirmed:
            f = self.conn.wait_for(lambda f: f.channel == self.number and f.type in (CONFIRM, RETURN),
                                   max(0.0, deadline - time.monotonic()), "confirms")
            self.handle(f)

    def subscribe(self, queue, consumer_tag="", prefetch_count=0, prefetch_bytes=0, auto_ack=False,
                  exclusive=False, priority=0, args=None):
        _, r = self.conn.request(SUBSCRIBE, self.number,
                                 Writer().str8(queue).str8(consumer_tag).flags(auto_ack, exclusive).i16(priority)
                                 .u32(prefetch_count).u32(prefetch_bytes).table(args).bytes(),
                                 replies=(SUBSCRIBE_OK,))
        tag = r.str8()
        r.done()
        return tag

    def cancel(self, consumer_tag):
        self._ok(CANCEL, Writer().str8(consumer_tag).bytes())

    def next_deliveries(self, consumer_tag, timeout=10.0):
        """The deliveries of the next DELIVER frame for this consumer."""
        f = self.conn.wait_for(lambda f: f.channel == self.number and f.type == DELIVER and
                               Reader(f.payload).str8() == consumer_tag, timeout, f"DELIVER for {consumer_tag}")
        _, ds = decode_deliver(f.payload, f.flags & 3)
        for d in ds:
            self.unacked[d["tag"]] = d
        return ds

    def settle(self, entries):
        """entries: (op, first, last[, arg]). first = 0 means every outstanding tag <= last (§9.3)."""
        w = Writer().u16(len(entries))
        for e in entries:
            op, first, last = e[:3]
            w.u8(op).u64(first).u64(last).u32(e[3] if len(e) > 3 else 0)
            for t in list(self.unacked):
                if (first == 0 and t <= last) or first <= t <= last:
                    del self.unacked[t]
        self.conn.send(SETTLE, self.number, w.bytes())

    def close(self):
        """CHANNEL_CLOSE, then wait for CHANNEL_CLOSE_OK; returns the channel's frames that came before it."""
        self.conn.send(CHANNEL_CLOSE, self.number, Writer().u16(0).str16("done").bytes())
        self.conn.wait_for(lambda f: f.channel == self.number and f.type == CHANNEL_CLOSE_OK,
                           what="CHANNEL_CLOSE_OK")
        mine = [f for f in self.conn.inbox if f.channel == self.number]
        self.conn.inbox = [f for f in self.conn.inbox if f.channel != self.number]
        return mine


# ---------------------------------------------------------------------------------------------------------------
# Test vectors (spec/vectors): the encoder must produce them byte for byte, the decoder must read them

def check_vectors(directory):
    with open(os.path.join(directory, "valid.json")) as fh:
        vectors = {v["name"]: v for v in json.load(fh)["vectors"]}

    def tbl(fields):
        out = []
        for fld in fields:
            (kind, value), = fld["value"].items()
            out.append((fld["key"], kind, tbl(value) if kind == "table" else value))
        return out

    def expect(name, got):
        want = bytes.fromhex(vectors[name]["hex"])
        if got != want:
            raise AssertionError(f"vector {name}: encoded\n  {got.hex()}\nwant\n  {want.hex()}")

    b = vectors["auth_plain"]["body"]
    expect("auth_plain", frame(AUTH, 0, Writer().str8(b["mechanism"]).bytes32(base64.b64decode(b["response"]))
                               .str8(b["product"]).str8(b["version"]).strlist(b["capabilities"])
                               .u32(b["max_frame"]).u16(b["max_channels"]).u32(b["heartbeat_ms"]).bytes()))
    expect("channel_open", frame(CHANNEL_OPEN, 1, struct.pack("<I", 1)))
    b = vectors["exchange_declare"]["body"]
    expect("exchange_declare", frame(EXCHANGE_DECLARE, 1, Writer().u32(b["req"]).str8(b["name"]).u8(b["kind"])
                                     .flags(b["durable"], b["auto_delete"], b["internal"], b["passive"])
                                     .str8(b["alternate_exchange"]).table(tbl(b["args"])).bytes()))
    b = vectors["queue_declare"]["body"]
    expect("queue_declare", frame(QUEUE_DECLARE, 1, Writer().u32(b["req"]).str8(b["name"])
                                  .flags(b["durable"], b["exclusive"], b["auto_delete"], b["passive"])
                                  .table(tbl(b["args"])).bytes()))
    b = vectors["bind"]["body"]
    expect("bind", frame(BIND, 1, Writer().u32(b["req"]).flags(b["to_exchange"]).str8(b["destination"])
                         .str8(b["source"]).str8(b["routing_key"]).table(tbl(b["args"])).bytes()))
    b = vectors["publish_one"]["body"]
    w = Writer().u64(b["first_seq"]).u32(len(b["messages"])).str8(b["exchange"])
    for m in b["messages"]:
        encode_message(w, m["routing_key"], base64.b64decode(m["body"]), m["persistent"], m["mandatory"],
                       m["priority"])
    expect("publish_one", frame(PUBLISH, 1, w.bytes()))
    b = vectors["subscribe"]["body"]
    expect("subscribe", frame(SUBSCRIBE, 1, Writer().u32(b["req"]).str8(b["queue"]).str8(b["consumer_tag"])
                              .flags(b["auto_ack"], b["exclusive"]).i16(b["priority"]).u32(b["prefetch_count"])
                              .u32(b["prefetch_bytes"]).table(tbl(b["args"])).bytes()))
    w = Writer().u16(len(vectors["settle"]["body"]["entries"]))
    for e in vectors["settle"]["body"]["entries"]:
        w.u8(e["op"]).u64(e["first"]).u64(e["last"]).u32(e["arg"])
    expect("settle", frame(SETTLE, 1, w.bytes()))

    # Decoding.
    raw = bytes.fromhex(vectors["deliver"]["hex"])
    length, ftype, flags, channel = HEADER.unpack_from(raw)
    tag, ds = decode_deliver(raw[8:8 + length], flags & 3)
    want = vectors["deliver"]["body"]
    assert tag == want["consumer_tag"] and len(ds) == len(want["deliveries"])
    for d, wd in zip(ds, want["deliveries"]):
        for k in ("tag", "redelivered", "persistent", "priority", "delivery_count", "failed_count", "exchange",
                  "routing_key"):
            assert d[k] == wd[k], (k, d[k], wd[k])
        assert d["body"] == base64.b64decode(wd["body"])
    raw = bytes.fromhex(vectors["confirm"]["hex"])
    assert decode_confirm(raw[8:]) == [(r["first"], r["last"], r["code"]) for r in vectors["confirm"]["body"]["ranges"]]
    raw = bytes.fromhex(vectors["publish_batch"]["hex"])
    r = Reader(raw[8:])
    r.u64(), r.u32(), r.str8()
    msgs = [decode_message(r) for _ in range(3)]
    r.done()
    assert msgs[0]["properties"]["message_id"] == b"m-1"
    assert msgs[1]["properties"]["deaths"][0]["reason"] == "rejected"
    return len(vectors)


# ---------------------------------------------------------------------------------------------------------------
# The scenario

class Check:
    def __init__(self):
        self.passed = 0

    def __call__(self, cond, what):
        if not cond:
            raise AssertionError(what)
        self.passed += 1
        print(f"ok   {what}")


def expect_close(conn, code, what, timeout=5.0):
    """Reads until the broker's CLOSE; returns its reason. Checks the socket is closed after it (§5.6)."""
    try:
        conn.wait_for(lambda f: False, timeout, what)
    except ConnectionClosed as e:
        if e.code != code:
            raise AssertionError(f"{what}: broker closed with {e.code} ({e.reason}), want {code} {CODES[code]}")
        if not conn.socket_closed_within(timeout):
            raise AssertionError(f"{what}: the socket stayed open after CLOSE")
        return e.reason
    raise AssertionError(f"{what}: no CLOSE")


def fresh(args, **kw):
    c = Connection(args.addr, args.verbose)
    c.handshake(args.user, args.password, **kw)
    return c


def scenario(args, check):
    suffix = uuid.uuid4().hex[:8]
    ex, dlx, q, dead = f"demo.x.{suffix}", f"demo.dlx.{suffix}", f"demo.q.{suffix}", f"demo.dead.{suffix}"

    # -- handshake and heartbeats -----------------------------------------------------------------------------
    conn = Connection(args.addr, args.verbose)
    ok = conn.handshake(args.user, args.password, heartbeat_ms=400)
    check(conn.hello["product"] != "" and "PLAIN" in conn.hello["mechanisms"],
          f"HELLO from {conn.hello['product']} {conn.hello['version']}, mechanisms {conn.hello['mechanisms']}, "
          f"capabilities {conn.hello['capabilities']}")
    want_hb = min(400, conn.hello["heartbeat_ms"]) if conn.hello["heartbeat_ms"] else 400
    check(ok["heartbeat_ms"] == want_hb and ok["max_frame"] == conn.hello["max_frame"],
          f"OPEN_OK: connection {ok['connection_id']}, max_frame {ok['max_frame']}, heartbeat {ok['heartbeat_ms']} ms "
          f"(the smaller of ours and the broker's {conn.hello['heartbeat_ms']})")
    conn.longest_silence = 0.0
    conn.pump(3 * ok["heartbeat_ms"] / 1000)
    hb = ok["heartbeat_ms"] / 1000
    check(conn.heartbeats_received >= 1 and conn.closed is None and conn.longest_silence < 2 * hb,
          f"quiet for 3 heartbeat intervals: still open, {conn.heartbeats_received} heartbeats received "
          f"(at most {conn.longest_silence * 1000:.0f} ms apart, under 2H), {conn.heartbeats_sent} sent")

    # -- topology -------------------------------------------------------------------------------------------
    ch = conn.open_channel(1)
    ch.declare_exchange(ex, "direct", durable=True)
    ch.declare_exchange(dlx, "fanout", durable=True)
    info = ch.declare_queue(q, durable=True, args=[("dead-letter-exchange", "string", dlx)])
    check(info == {"name": q, "messages": 0, "consumers": 0}, f"declared durable queue {q} with a dead-letter exchange")
    ch.declare_queue(dead, durable=True)
    ch.bind(q, ex, "work")
    ch.bind(dead, dlx, "")
    check(True, "declared exchanges and bound the queues")
    try:
        ch.declare_queue(f"missing.{suffix}", passive=True)
        check(False, "passive declare of a missing queue fails")
    except RequestFailed as e:
        check(e.code == CODE["not_found"], f"passive declare of a missing queue: ERROR {e.code} ({e.message})")
    try:
        ch.declare_queue(q, durable=False)
        check(False, "re-declare with other settings fails")
    except RequestFailed as e:
        check(e.code == CODE["precondition_failed"], f"re-declare with other settings: ERROR {e.code} ({e.message})")
    check(ch.declare_queue(q, passive=True)["name"] == q, "the channel is usable after ERRORs")

    # -- publish with confirms ------------------------------------------------------------------------------
    batch1 = ch.publish(ex, [dict(routing_key="work", body=f"m{i}".encode(), persistent=True,
                                  properties={"message_id": f"m{i}", "content_type": "text/plain"})
                             for i in range(1, 7)])
    batch2 = ch.publish(ex, [dict(routing_key="work", body=f"m{i}".encode(), persistent=True,
                                  properties={"message_id": f"m{i}"}) for i in range(7, 11)])
    [unroutable] = ch.publish(ex, [dict(routing_key="nowhere", body=b"lost", mandatory=True, persistent=True)])
    [no_exchange] = ch.publish(f"no-such-exchange.{suffix}", [dict(routing_key="x", body=b"x", persistent=True)])
    ch.wait_confirms()
    check(batch1 == list(range(1, 7)) and batch2 == list(range(7, 11)), "sequence numbers 1..10 in two batches")
    check(all(ch.confirms[s] == 0 for s in batch1 + batch2), "every persistent message acked (code ok)")
    check(unroutable in ch.returns and ch.returns[unroutable][0] == CODE["no_route"]
          and ch.returns[unroutable][2]["body"] == b"lost" and ch.confirms[unroutable] == 0,
          f"mandatory unroutable seq {unroutable}: RETURN no_route, then acked")
    check(ch.confirms[no_exchange] == CODE["exchange_not_found"],
          f"publish to a missing exchange: nacked with {ch.confirms[no_exchange]} exchange_not_found")
    check(ch.declare_queue(q, passive=True)["messages"] == 10, "the queue holds 10 ready messages")

    # -- consume with a prefetch ----------------------------------------------------------------------------
    tag = ch.subscribe(q, "c1", prefetch_count=3)
    check(tag == "c1", "SUBSCRIBE_OK with our consumer tag")
    got = []
    while len(got) < 3:
        got += ch.next_deliveries(tag)
    info = ch.declare_queue(q, passive=True)  # answered after everything queued before it (§7.2)
    extra = [f for f in conn.inbox if f.type == DELIVER]
    check(len(got) == 3 and not extra and info["messages"] == 7 and info["consumers"] == 1,
          f"prefetch 3: 3 deliveries and no more, 7 ready, 1 consumer")
    check([d["body"] for d in got] == [b"m1", b"m2", b"m3"] and [d["tag"] for d in got] == [1, 2, 3]
          and all(d["delivery_count"] == 1 and not d["redelivered"] and d["persistent"] for d in got)
          and got[0]["properties"].get("content_type") == b"text/plain" and got[0]["exchange"] == ex,
          "deliveries in order, tags 1..3, first delivery, persistent, properties intact")

    ch.settle([(SETTLE_ACK, 1, 2)])                      # ack m1, m2
    ch.settle([(SETTLE_REQUEUE, 3, 3)])                  # nack m3 with requeue
    seen = []
    while not any(d["body"] == b"m3" for d in seen):
        seen += ch.next_deliveries(tag)
    m3 = next(d for d in seen if d["body"] == b"m3")
    check(m3["redelivered"] and m3["delivery_count"] == 2 and m3["failed_count"] == 1 and m3["tag"] > 3
          and m3["properties"]["message_id"] == b"m3",
          f"requeued m3 redelivered: tag {m3['tag']}, redelivered, delivery_count 2, failed_count 1")
    check(len(ch.unacked) <= 3, f"never more than 3 unacked (now {len(ch.unacked)})")

    # Reject one: it goes to the dead-letter exchange (§9.3, §13.4).
    victim = next(d for d in ch.unacked.values() if d["body"] != b"m3")
    ch.settle([(SETTLE_REJECT, victim["tag"], victim["tag"])])
    ch2 = conn.open_channel(2)
    dtag = ch2.subscribe(dead, "dead1", prefetch_count=10)
    [dl] = ch2.next_deliveries(dtag)
    deaths = dl["properties"].get("deaths", [])
    check(dl["body"] == victim["body"] and dl["exchange"] == dlx and dl["routing_key"] == "work"
          and deaths and deaths[0]["queue"] == q and deaths[0]["reason"] == "rejected"
          and deaths[0]["count"] == 1 and deaths[0]["exchange"] == ex and deaths[0]["routing_keys"] == ["work"],
          f"rejected {victim['body'].decode()} dead-lettered to {dead} with deaths "
          f"[{deaths[0]['queue'] if deaths else '?'} {deaths[0]['reason'] if deaths else '?'}]")
    ch2.settle([(SETTLE_ACK, dl["tag"], dl["tag"])])
    ch2.cancel(dtag)

    # Drain the rest, acking with "multiple" (first = 0), at most 3 outstanding at any time.
    received = {d["body"] for d in got + seen}
    most = len(ch.unacked)
    while len(received) < 10:
        ch.settle([(SETTLE_ACK, 0, max(ch.unacked))])
        for d in ch.next_deliveries(tag):
            received.add(d["body"])
        most = max(most, len(ch.unacked))
    ch.settle([(SETTLE_ACK, 0, max(ch.unacked))])
    info = ch.declare_queue(q, passive=True)
    check(received == {f"m{i}".encode() for i in range(1, 11)} and most <= 3 and info["messages"] == 0,
          f"all 10 messages consumed, at most {most} unacked at a time, queue empty")
    ch.cancel(tag)
    info = ch.declare_queue(q, passive=True)
    check(info["consumers"] == 0, "CANCEL answered OK; the queue has no consumer")

    # -- channel-scoped errors ------------------------------------------------------------------------------
    try:
        ch.settle([(SETTLE_ACK, 999, 999)])
        ch.declare_queue(q, passive=True)
        check(False, "settling an unknown tag closes the channel")
    except ChannelClosed as e:
        check(e.code == CODE["unknown_delivery_tag"], f"unknown delivery tag: CHANNEL_CLOSE {e.code} ({e.reason})")
    ch = conn.open_channel(1)  # the id may be reused after CHANNEL_CLOSE_OK
    ch.next_seq = 5  # not the channel's next sequence number (1)
    ch.publish(ex, [dict(routing_key="work", body=b"x")])
    try:
        ch.declare_queue(q, passive=True)
        check(False, "a publish sequence gap closes the channel")
    except ChannelClosed as e:
        check(e.code == CODE["sequence_error"], f"publish sequence gap: CHANNEL_CLOSE {e.code} ({e.reason})")
    check(ch2.declare_queue(dead, passive=True)["messages"] == 0, "other channels unaffected")

    # Close a channel with confirms outstanding: they come before CHANNEL_CLOSE_OK, never after (§6), so the id
    # can be reused at once.
    ch3 = conn.open_channel(3)
    ch3.publish(ex, [dict(routing_key="work", body=b"late", persistent=True) for _ in range(20)])
    before = ch3.close()
    confirmed = {s for f in before if f.type == CONFIRM for a, b, _ in decode_confirm(f.payload) for s in range(a, b + 1)}
    ch3 = conn.open_channel(3)
    ch3.publish(ex, [dict(routing_key="work", body=b"again", persistent=True)])
    ch3.wait_confirms()
    check(confirmed == set(range(1, 21)) and ch3.confirms == {1: 0},
          "closing with 20 confirms owed: all 20 before CHANNEL_CLOSE_OK; the reopened channel's seq 1 confirmed alone")
    ch2.delete_queue(q)
    ch3.close()

    # -- clean up, close ------------------------------------------------------------------------------------
    ch2.delete_queue(dead)
    ch2.delete_exchange(ex)
    ch2.delete_exchange(dlx)
    ch2.close()
    conn.close()
    check(conn.closed is None, "CHANNEL_CLOSE → CHANNEL_CLOSE_OK, CLOSE → CLOSE_OK")

    # -- bad input ------------------------------------------------------------------------------------------
    s = socket.create_connection(tuple([args.addr.rsplit(":", 1)[0], int(args.addr.rsplit(":", 1)[1])]), timeout=5)
    s.sendall(b"WARREN\x09\x00")
    answer = b""
    while True:
        data = s.recv(64)
        if not data:
            break
        answer += data
    s.close()
    check(answer[:6] == b"WARREN" and len(answer) == 8,
          f"unsupported major version: the broker's own preamble {answer.hex()} and the socket closed")

    c = Connection(args.addr, args.verbose)
    c.send_raw(PREAMBLE)
    c.wait_for(lambda f: f.type == HELLO, what="HELLO")
    c.send(AUTH, 0, Writer().str8("PLAIN").bytes32(b"\x00guest\x00wrong").str8("x").str8("1").strlist([])
           .u32(0).u16(0).u32(0).bytes())
    reason = expect_close(c, CODE["auth_failed"], "bad password")
    check(True, f"bad password: CLOSE auth_failed ({reason})")

    bad = [
        ("unknown frame type 0x50", lambda c: c.send_raw(frame(0x50, 0)), "unknown_frame_type"),
        ("oversize length (header only, no payload sent)",
         lambda c: c.send_raw(HEADER.pack(0x7FFFFFF0, CHANNEL_OPEN, 0, 1)), "frame_too_large"),
        ("truncated payload (CHANNEL_OPEN with 2 of its 4 bytes)",
         lambda c: c.send_raw(frame(CHANNEL_OPEN, 1, b"\x01\x00")), "frame_error"),
        ("trailing bytes (CHANNEL_OPEN with 5 bytes)",
         lambda c: c.send_raw(frame(CHANNEL_OPEN, 1, b"\x01\x00\x00\x00\x00")), "frame_error"),
        ("undefined header flag bit", lambda c: c.send_raw(frame(CHANNEL_OPEN, 1, struct.pack("<I", 1), 0x80)),
         "bad_flags"),
        ("CHANNEL_OPEN on channel 0", lambda c: c.send_raw(frame(CHANNEL_OPEN, 0, struct.pack("<I", 1))),
         "unexpected_frame"),
        ("a server-only frame (OK) from the client", lambda c: c.send_raw(frame(OK, 1, b"\0" * 12)),
         "unexpected_frame"),
        ("request on a channel that is not open",
         lambda c: c.send_raw(frame(QUEUE_DECLARE, 7, Writer().u32(1).str8("x").u8(8).table([]).bytes())),
         "channel_error"),
    ]
    for what, send_bad, code_name in bad:
        c = fresh(args)
        send_bad(c)
        reason = expect_close(c, CODE[code_name], what)
        check(True, f"{what}: CLOSE {code_name} ({reason}) and the socket closed")

    c = Connection(args.addr, args.verbose)  # before OPEN_OK the limit is 64 KiB (§3)
    c.send_raw(PREAMBLE)
    c.wait_for(lambda f: f.type == HELLO, what="HELLO")
    c.send_raw(HEADER.pack(PRE_OPEN_MAX_FRAME, AUTH, 0, 0))  # 65,544 bytes with the header
    reason = expect_close(c, CODE["frame_too_large"], "oversize AUTH")
    check(True, f"a frame over 64 KiB before OPEN_OK: CLOSE frame_too_large ({reason})")

    c = Connection(args.addr, args.verbose)
    c.send_raw(PREAMBLE)
    c.wait_for(lambda f: f.type == HELLO, what="HELLO")
    c.send_raw(frame(PUBLISH, 1, Writer().u64(1).u32(1).str8("").bytes()))
    reason = expect_close(c, CODE["unexpected_frame"], "PUBLISH before OPEN_OK")
    check(True, f"PUBLISH before OPEN_OK: CLOSE unexpected_frame ({reason})")

    c = Connection(args.addr, args.verbose)  # CLOSE before OPEN_OK is answered with CLOSE_OK, as after it (§5.5)
    c.send_raw(PREAMBLE)
    c.wait_for(lambda f: f.type == HELLO, what="HELLO")
    c.send(CLOSE, 0, Writer().u16(0).str16("never mind").bytes())
    f = c.wait_for(lambda f: True, what="CLOSE_OK")
    check(f.type == CLOSE_OK and c.socket_closed_within(5), "CLOSE before OPEN_OK: CLOSE_OK, then the socket closed")

    c = fresh(args, heartbeat_ms=50)  # the broker may raise a short interval; its heartbeats come within 2H (§5.4)
    c.longest_silence = 0.0
    c.pump(1.0)
    hb = c.open_ok["heartbeat_ms"] / 1000
    check(c.open_ok["heartbeat_ms"] >= 50 and c.closed is None and c.longest_silence < 2 * hb,
          f"asked for 50 ms heartbeats: got {c.open_ok['heartbeat_ms']} ms; the broker's came at most "
          f"{c.longest_silence * 1000:.0f} ms apart")
    c.close()

    c = fresh(args)  # an extension frame (0xE0..0xFF) is skipped, and the connection carries on (§14)
    c.send_raw(frame(0xE7, 0, b"ignore me"))
    c.open_channel(1)
    check(True, "extension frame type 0xE7 ignored; the connection carries on")
    c.close()

    c = fresh(args)  # a frame cut short by the socket closing: nothing to answer, nothing else breaks
    c.send_raw(frame(CHANNEL_OPEN, 1, struct.pack("<I", 1))[:6])
    c.sock.shutdown(socket.SHUT_WR)
    try:
        c.wait_for(lambda f: False, 5, "the broker to close")
    except ConnectionClosed as e:
        check(e.code == -1, f"a frame cut short by EOF: the broker closes the socket without CLOSE")

    c = fresh(args, heartbeat_ms=300)  # stop heartbeating: the broker must give up after 2 intervals (§5.4)
    c.send_heartbeats = False
    t0 = time.monotonic()
    reason = expect_close(c, CODE["heartbeat_timeout"], "heartbeat timeout", timeout=5)
    elapsed = time.monotonic() - t0
    check(0.45 <= elapsed <= 2.0, f"silent client: CLOSE heartbeat_timeout after {elapsed:.2f} s with 300 ms "
                                  f"heartbeats ({reason})")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--addr", default="127.0.0.1:5680")
    ap.add_argument("--user", default="guest")
    ap.add_argument("--password", default="guest")
    ap.add_argument("--vectors", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "vectors"))
    ap.add_argument("-v", "--verbose", action="store_true", help="print every frame")
    args = ap.parse_args()
    check = Check()
    try:
        if os.path.isdir(args.vectors):
            check(True, f"encoder and decoder agree with spec/vectors ({check_vectors(args.vectors)} vectors read)")
        scenario(args, check)
    except Exception as e:  # noqa: BLE001 - report any failure and exit non-zero
        print(f"FAIL {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"PASS {check.passed} checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
