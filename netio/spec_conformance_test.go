package netio_test

import (
	"testing"
	"time"

	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// Behaviour a client written from spec/PROTOCOL.md relies on, found by
// writing spec/examples/minimal_client.py from the spec alone.

// §5.5: the receiver of CLOSE answers CLOSE_OK, before OPEN_OK as after
// (it used to answer CLOSE ok).
func TestCloseBeforeOpenAnsweredWithCloseOK(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	r := rawHello(t, s)
	r.write(wire.AppendFrame(nil, 0, &wire.Close{Code: wire.OK, Reason: "changed my mind"}))
	b := r.read()
	if _, ok := b.(*wire.CloseOK); !ok {
		t.Fatalf("answer to CLOSE before OPEN_OK: %#v, want CLOSE_OK", b)
	}
	if b := r.read(); b != nil {
		t.Fatalf("after CLOSE_OK: %#v, want the socket closed", b)
	}
}

// §5.4: the negotiated heartbeat is at least two of the broker's ticks; a
// shorter one would have the broker's heartbeats (sent on the tick) arrive
// later than the 2×H a peer allows.
func TestHeartbeatFloor(t *testing.T) {
	negotiated := func(s *netio.Server, ask uint32) uint32 {
		t.Helper()
		r := rawHello(t, s)
		r.write(wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), HeartbeatMs: ask}))
		ok, isOK := r.read().(*wire.OpenOK)
		if !isOK {
			t.Fatal("no OPEN_OK")
		}
		return ok.HeartbeatMs
	}
	def := warrentest.StartServer(t, nil) // 100 ms tick, 30 s proposed
	for _, c := range []struct{ ask, want uint32 }{{1, 200}, {40, 200}, {199, 200}, {200, 200}, {450, 450}, {0, 30000}, {60000, 30000}} {
		if got := negotiated(def, c.ask); got != c.want {
			t.Errorf("default broker, client asks %d ms: OPEN_OK heartbeat %d ms, want %d", c.ask, got, c.want)
		}
	}
	fast := warrentest.StartServer(t, &netio.Config{TickInterval: 10 * time.Millisecond})
	if got := negotiated(fast, 40); got != 40 {
		t.Errorf("10 ms tick, client asks 40 ms: OPEN_OK heartbeat %d ms, want 40", got)
	}
	short := warrentest.StartServer(t, &netio.Config{HeartbeatMs: 50})
	if got := negotiated(short, 0); got != 200 {
		t.Errorf("broker proposes 50 ms, client 0: OPEN_OK heartbeat %d ms, want 200", got)
	}
}

// readOn returns the next frame's channel and body; ok false when the
// broker closed the socket (or sent nothing within 10 s).
func (r *rawConn) readOn() (ch uint16, b wire.Body, ok bool) {
	r.t.Helper()
	ch, b, err := r.next()
	return ch, b, err == nil
}

// expectOn reads until a frame of type T on channel ch (skipping
// heartbeats and other channels) and returns it, failing on anything else
// on ch.
func expectOn[T wire.Body](r *rawConn, ch uint16, what string) T {
	r.t.Helper()
	for {
		c, b, ok := r.readOn()
		if !ok {
			r.t.Fatalf("%s: socket closed", what)
		}
		if c != ch {
			continue
		}
		if t, is := b.(T); is {
			return t
		}
		r.t.Fatalf("%s: got %T %+v on channel %d", what, b, b, ch)
	}
}

// persistentBatch is a PUBLISH of n persistent messages to the default
// exchange for queue q, numbered from first.
func persistentBatch(ch uint16, first uint64, n int, q string) []byte {
	buf, mark := wire.BeginPublish(nil, ch, first, nil)
	for range n {
		buf = wire.AppendMessage(buf, &wire.Message{Flags: wire.Persistent, RoutingKey: []byte(q), Body: []byte("payload")})
	}
	return mark.End(buf, uint32(n))
}

// §6: nothing of a closed channel arrives after the frame that ends it
// (the CHANNEL_CLOSE_OK answering the client's close, or the broker's own
// CHANNEL_CLOSE), so a client may reopen the id at once without taking an
// old CONFIRM or reply for the new channel's. The CONFIRMs of persistent
// batches (sent after their fsync) and the answer to a purge used to come
// after CHANNEL_CLOSE_OK (20 of 20 times by spec/examples' probe).
func TestNothingAfterChannelEnd(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	r := rawDial(t, s, 0)
	r.write(wire.AppendFrame(nil, 2, &wire.ChannelOpen{Req: 1}))
	expectOn[*wire.OKReply](r, 2, "open 2")
	r.write(wire.AppendFrame(nil, 2, &wire.QueueDeclare{Req: 2, Name: "owed", Durable: true}))
	expectOn[*wire.QueueDeclareOK](r, 2, "declare")

	// The client closes: the CONFIRM and the purge's OK come first.
	for round := range 10 {
		r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 10}))
		expectOn[*wire.OKReply](r, 1, "open 1") // fails on a CONFIRM or OK left from the last round
		out := persistentBatch(1, 1, 50, "owed")
		out = wire.AppendFrame(out, 1, &wire.QueuePurge{Req: 11, Name: "owed"})
		out = wire.AppendFrame(out, 1, &wire.ChannelClose{Code: wire.OK})
		r.write(out)
		var confirmed, purged bool
		for {
			_, b, ok := r.readOn()
			if !ok {
				t.Fatalf("round %d: socket closed", round)
			}
			switch b := b.(type) {
			case *wire.Confirm:
				confirmed = len(b.Ranges) == 1 && b.Ranges[0].First == 1 && b.Ranges[0].Last == 50
			case *wire.OKReply:
				purged = b.Req == 11
			case *wire.ChannelCloseOK:
			default:
				continue
			}
			if _, end := b.(*wire.ChannelCloseOK); end {
				break
			}
		}
		if !confirmed || !purged {
			t.Fatalf("round %d: CHANNEL_CLOSE_OK before the CONFIRM (%v) or the purge's OK (%v)", round, confirmed, purged)
		}
	}

	// The broker closes (a sequence gap): the CONFIRM of what came before
	// the gap comes first, then CHANNEL_CLOSE.
	for round := range 5 {
		r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 20}))
		expectOn[*wire.OKReply](r, 1, "reopen 1")
		r.write(append(persistentBatch(1, 1, 50, "owed"), persistentBatch(1, 99, 1, "owed")...))
		c := expectOn[*wire.Confirm](r, 1, "the CONFIRM before the channel's end")
		if c.Ranges[0].First != 1 || c.Ranges[len(c.Ranges)-1].Last != 50 {
			t.Fatalf("round %d: CONFIRM %+v, want 1..50", round, c.Ranges)
		}
		if cl := expectOn[*wire.ChannelClose](r, 1, "CHANNEL_CLOSE"); cl.Code != wire.SequenceError {
			t.Fatalf("round %d: CHANNEL_CLOSE %v, want sequence_error", round, cl.Code)
		}
		r.write(wire.AppendFrame(nil, 1, &wire.ChannelCloseOK{}))
	}

	// Both close at once while answers are owed: the client's close is
	// answered with CHANNEL_CLOSE_OK after the CONFIRM, whether or not the
	// broker's CHANNEL_CLOSE was out yet.
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 30}))
	expectOn[*wire.OKReply](r, 1, "reopen 1")
	out := append(persistentBatch(1, 1, 50, "owed"), persistentBatch(1, 99, 1, "owed")...)
	r.write(wire.AppendFrame(out, 1, &wire.ChannelClose{Code: wire.OK}))
	expectOn[*wire.Confirm](r, 1, "the CONFIRM before the channel's end")
	for {
		_, b, ok := r.readOn()
		if !ok {
			t.Fatal("socket closed")
		}
		if _, end := b.(*wire.ChannelCloseOK); end {
			break
		}
	}
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 31}))
	if ok := expectOn[*wire.OKReply](r, 1, "reopen after both closed"); ok.Req != 31 {
		t.Fatalf("reopen answered req %d, want 31", ok.Req)
	}
}

// §6, §8.2: a channel's end waits for the confirms that are coming (an
// fsync), never for one a queue's backlog holds back. The messages of a
// held confirm are in the queue, so its end confirms them (ack) and then
// ends it. CHANNEL_CLOSE_OK used to wait until the queue drained below half
// its soft limit: with no consumer, forever, and the id stayed taken.
func TestChannelEndReleasesBacklogHolds(t *testing.T) {
	for _, durable := range []bool{false, true} {
		name := "memory"
		cfg := &netio.Config{QueueSoftLimit: 5}
		if durable {
			name, cfg.DataDir = "durable", t.TempDir()
		}
		t.Run(name, func(t *testing.T) {
			s := warrentest.StartServer(t, cfg)
			r := rawDial(t, s, 0)
			r.write(wire.AppendFrame(nil, 2, &wire.ChannelOpen{Req: 1}))
			expectOn[*wire.OKReply](r, 2, "open 2")
			r.write(wire.AppendFrame(nil, 2, &wire.QueueDeclare{Req: 2, Name: "backlog", Durable: durable}))
			expectOn[*wire.QueueDeclareOK](r, 2, "declare")

			// held publishes a batch of n on channel 1 past the soft limit
			// and checks that its confirm is held: the passive declare,
			// answered by the queue's shard after the enqueue (and, durable,
			// after its apply: a barrier), comes first.
			held := func(first uint64, n int, wantReady uint64) {
				t.Helper()
				out := persistentBatch(1, first, n, "backlog")
				r.write(wire.AppendFrame(out, 1, &wire.QueueDeclare{Req: 3, Name: "backlog", Passive: true}))
				ok := expectOn[*wire.QueueDeclareOK](r, 1, "passive declare (a CONFIRM first: not held)")
				if ok.Messages != wantReady {
					t.Fatalf("passive declare: %d messages, want %d", ok.Messages, wantReady)
				}
			}
			confirmed := func(first, last uint64) {
				t.Helper()
				c := expectOn[*wire.Confirm](r, 1, "the held CONFIRM before the channel's end")
				if len(c.Ranges) != 1 || c.Ranges[0].First != first || c.Ranges[0].Last != last || c.Ranges[0].Code != wire.OK {
					t.Fatalf("CONFIRM %+v, want %d..%d ok", c.Ranges, first, last)
				}
			}

			// The client closes.
			r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 10}))
			expectOn[*wire.OKReply](r, 1, "open 1")
			held(1, 20, 20)
			r.write(wire.AppendFrame(nil, 1, &wire.ChannelClose{Code: wire.OK}))
			confirmed(1, 20)
			expectOn[*wire.ChannelCloseOK](r, 1, "CHANNEL_CLOSE_OK")

			// The broker closes (a sequence gap).
			r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 20}))
			expectOn[*wire.OKReply](r, 1, "reopen 1")
			held(1, 10, 30)
			r.write(persistentBatch(1, 99, 1, "backlog"))
			confirmed(1, 10)
			if cl := expectOn[*wire.ChannelClose](r, 1, "CHANNEL_CLOSE"); cl.Code != wire.SequenceError {
				t.Fatalf("CHANNEL_CLOSE %v, want sequence_error", cl.Code)
			}
			r.write(wire.AppendFrame(nil, 1, &wire.ChannelCloseOK{}))

			// A batch in flight to the queue when the close is read (its
			// fsync not done yet, durable) is not held either.
			r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 30}))
			expectOn[*wire.OKReply](r, 1, "reopen 1")
			out := persistentBatch(1, 1, 5, "backlog")
			r.write(wire.AppendFrame(out, 1, &wire.ChannelClose{Code: wire.OK}))
			confirmed(1, 5)
			expectOn[*wire.ChannelCloseOK](r, 1, "CHANNEL_CLOSE_OK")

			// Backpressure still holds on an open channel; the
			// connection's CLOSE is answered whatever is held.
			r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 40}))
			expectOn[*wire.OKReply](r, 1, "reopen 1")
			held(1, 5, 40)
			r.write(wire.AppendFrame(nil, 0, &wire.Close{Code: wire.OK}))
			for {
				c, b, ok := r.readOn()
				if !ok {
					t.Fatal("socket closed before CLOSE_OK")
				}
				if _, is := b.(*wire.CloseOK); is && c == 0 {
					break
				}
			}
		})
	}
}
