package netio

import (
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/internal/syncbuf"
	"github.com/warren-mq/warren/wire"
)

// waitFor waits, with a deadline, for cond on the server's connection-side
// state, waking at each change of it (Server.Changed): an event, not a
// poll with sleeps.
func waitFor(t *testing.T, s *Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		changed := s.Changed() // before cond: a change in between is not missed
		if cond() {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// readClose reads frames until a CLOSE (nil: the socket closed first).
func readClose(nc net.Conn) *wire.Close {
	_ = nc.SetReadDeadline(time.Now().Add(20 * time.Second))
	var buf []byte
	tmp := make([]byte, 4096)
	for {
		f, n, err := wire.Split(buf, wire.HandshakeMaxFrame)
		if err != nil {
			return nil
		}
		if n > 0 {
			buf = buf[n:]
			if b, _ := wire.Decode(f, wire.HandshakeMaxFrame, nil); b != nil {
				if c, ok := b.(*wire.Close); ok {
					return c
				}
			}
			continue
		}
		m, err := nc.Read(tmp)
		if err != nil {
			return nil
		}
		buf = append(buf, tmp[:m]...)
	}
}

// Issue 11 item 9: an idle-socket flood at the unauthenticated cap costs
// the broker one eviction per accept, and an eviction is constant work:
// the connection to close is found without walking past the ones whose
// credentials are being checked, no log line is written per eviction
// (a rate-limited summary instead), and closing a connection that never
// authenticated sends the shards nothing (it cannot own a queue or a
// consumer; a Down is a pass over every queue of every shard, which the
// pair beside the flood shares). The evicted socket still gets the CLOSE
// with the reason.
func TestEvictionIsConstantWork(t *testing.T) {
	var logs syncbuf.Buffer
	s, err := Start(Config{
		Addr: "127.0.0.1:0", MaxUnauthenticated: 4,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	addr := s.Addr().String()
	dial := func() net.Conn {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		return nc
	}
	unauthState := func(st uint32) int {
		s.connsMu.Lock()
		defer s.connsMu.Unlock()
		n := 0
		for _, c := range s.conns {
			if c.unauth && c.state.Load() == st {
				n++
			}
		}
		return n
	}

	// Three connections whose credentials are being checked: every
	// password-check slot is taken, so their checks wait.
	for i := 0; i < cap(s.auth.checks); i++ {
		s.auth.checks <- struct{}{}
	}
	released := false
	release := func() {
		if !released {
			released = true
			for i := 0; i < cap(s.auth.checks); i++ {
				<-s.auth.checks
			}
		}
	}
	t.Cleanup(release)
	const checking = 3
	for i := 0; i < checking; i++ {
		nc := dial()
		b := append([]byte(nil), wire.Preamble[:]...)
		b = wire.AppendFrame(b, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("nobody", "wrong"), MaxFrame: wire.MinMaxFrame})
		if _, err := nc.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, s, "three credential checks in progress", func() bool { return unauthState(stAuthPending) == checking })

	// One idle socket fills the cap; each of the next ones evicts the
	// oldest idle one.
	const evictions = 20
	idle := []net.Conn{dial()}
	waitFor(t, s, "the cap to fill", func() bool { return s.unauthenticatedCount() == checking+1 })
	for i := 0; i < evictions; i++ {
		idle = append(idle, dial())
		c := readClose(idle[i])
		if c == nil || c.Code != wire.ResourceLimit || !strings.Contains(c.Reason, "max_unauthenticated_connections") {
			t.Fatalf("evicted socket %d got %+v, want CLOSE resource_limit naming max_unauthenticated_connections", i, c)
		}
	}
	waitFor(t, s, "the evicted connections to close", func() bool {
		s.connsMu.Lock()
		defer s.connsMu.Unlock()
		return len(s.conns) == checking+1
	})
	s.connsMu.Lock()
	examined, evicted := s.adm.examined, s.adm.evicted
	s.connsMu.Unlock()
	if evicted != evictions {
		t.Fatalf("%d evictions counted, want %d", evicted, evictions)
	}
	if examined != evicted {
		t.Errorf("%d connections examined for %d evictions, want one each (the %d being checked were walked past)", examined, evicted, checking)
	}
	if n := logs.Count("closed to admit"); n == 0 || n > 2 {
		t.Errorf("%d log lines for %d evictions, want one (a summary, at most one each 10 s)", n, evictions)
	}
	if d := s.downs.Load(); d != 0 {
		t.Errorf("%d Down commands sent to the shards for %d connections that never authenticated, want 0", d, evictions)
	}

	// The checks finish (refused); a real client logs in and leaves: its
	// close does reach the shards.
	release()
	waitFor(t, s, "the refused logins to close", func() bool {
		s.connsMu.Lock()
		defer s.connsMu.Unlock()
		return len(s.conns) == 1 // the last idle socket
	})
	nc := dial()
	b := append([]byte(nil), wire.Preamble[:]...)
	b = wire.AppendFrame(b, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame})
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "the login", func() bool {
		s.connsMu.Lock()
		defer s.connsMu.Unlock()
		for _, c := range s.conns {
			if c.state.Load() == stOpen {
				return true
			}
		}
		return false
	})
	nc.Close()
	waitFor(t, s, "the logged-in connection's Down", func() bool { return s.downs.Load() > 0 })
	if d := s.downs.Load(); d != 1 {
		t.Fatalf("%d Down commands after one logged-in connection closed, want 1", d)
	}
}
