package abuse

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/wire"
)

// partialHandshakes: sockets that start a handshake and never finish it
// (issue 11 item 8; probeA.py, idle.py). Each must be closed by the broker
// within HandshakeWait.
func partialHandshakes() Probe {
	kinds := []struct {
		name  string
		start func(nc net.Conn) error
		// keep is sent every second while the socket is open (nil: nothing)
		keep []byte
	}{
		{"nothing sent", func(net.Conn) error { return nil }, nil},
		{"partial preamble \"WAR\"", func(nc net.Conn) error { _, err := nc.Write([]byte("WAR")); return err }, nil},
		{"preamble, no AUTH", func(nc net.Conn) error { _, err := nc.Write(wire.Preamble[:]); return err }, nil},
		{"AUTH header announcing 100 B, 10 sent", func(nc net.Conn) error {
			b := append(wire.Preamble[:0:0], wire.Preamble[:]...)
			b = append(b, 100, 0, 0, 0, byte(wire.TypeAuth), 0, 0, 0)
			b = append(b, "\x05PLAIN\x00\x00\x00"...)
			_, err := nc.Write(b)
			return err
		}, nil},
		{"preamble, then an extension frame every second", func(nc net.Conn) error {
			_, err := nc.Write(wire.Preamble[:])
			return err
		}, append([]byte{100, 0, 0, 0, 0xE5, 0, 0, 0}, make([]byte, 100)...)},
	}
	return Probe{
		Name:         "partial-handshakes",
		RSSAllowance: socketsAllowance,
		run: func(ctx context.Context, e *env, r *Result) {
			n := e.s.PartialSockets
			r.Tried = fmt.Sprintf("%d sockets each of: %s; each must be closed by the broker within %v",
				n, func() string {
					var ns []string
					for _, k := range kinds {
						ns = append(ns, k.name)
					}
					return strings.Join(ns, "; ")
				}(), e.s.HandshakeWait)
			type sock struct {
				kind int
				nc   net.Conn
				st   *sockState
			}
			var socks []sock
			start := time.Now()
			dialFail := 0
			for ki, k := range kinds {
				for i := 0; i < n; i++ {
					nc, err := dialRaw(ctx, e.b.Addr, 0)
					if err != nil {
						dialFail++
						continue
					}
					_ = k.start(nc)
					socks = append(socks, sock{ki, nc, watch(nc, start)})
				}
			}
			defer func() {
				for _, s := range socks {
					s.nc.Close()
				}
			}()
			if dialFail > 0 {
				r.notef("%d connects failed", dialFail)
			}
			openCount := func() int {
				n := 0
				for _, s := range socks {
					if s.st.ended() == 0 {
						n++
					}
				}
				return n
			}
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			lastKeep := time.Now()
			for openCount() > 0 && time.Since(start) < e.s.HandshakeWait {
				select {
				case <-ctx.Done():
					r.failf("stopped: %v", ctx.Err())
					return
				case <-tick.C:
				}
				if time.Since(lastKeep) >= time.Second {
					lastKeep = time.Now()
					for _, s := range socks {
						if kinds[s.kind].keep != nil && s.st.ended() == 0 {
							_ = s.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
							_, _ = s.nc.Write(kinds[s.kind].keep)
						}
					}
				}
			}
			for ki, k := range kinds {
				var closed []time.Duration
				stillOpen, logged := 0, 0
				reasons := map[string]int{}
				for _, s := range socks {
					if s.kind != ki {
						continue
					}
					if s.st.loggedIn.Load() {
						logged++
					}
					if s.st.ended() == 0 {
						stillOpen++
						continue
					}
					closed = append(closed, s.st.ended())
					reasons[s.st.closeReason()]++
				}
				r.notef("%s: %d closed by the broker (%s), %d still open after %v; CLOSE reasons: %v",
					k.name, len(closed), durStats(closed), stillOpen, e.s.HandshakeWait, reasons)
				if stillOpen > 0 {
					r.failf("%s: %d of %d sockets still open after %v", k.name, stillOpen, stillOpen+len(closed), e.s.HandshakeWait)
				}
				if logged > 0 {
					r.failf("%s: %d sockets logged in", k.name, logged)
				}
			}
		},
	}
}

// idleFlood: IdleSockets connections that never authenticate (half send
// nothing, half only the preamble), held for Duration while a new client
// logs in every second (issue 11 item 9; flood.py). Every such login must
// succeed.
func idleFlood() Probe {
	return Probe{
		Name: "idle-sockets",
		// Ten thousand connections with their buffers: 256 MiB.
		RSSAllowance: allowance(256 * MiB),
		Config: func(s Sizes) map[string]any {
			if s.IdleMaxConnections > 0 {
				return map[string]any{"max_connections": s.IdleMaxConnections}
			}
			return nil
		},
		run: func(ctx context.Context, e *env, r *Result) {
			n := e.s.IdleSockets
			mc := "the default max_connections (10,000)"
			if e.s.IdleMaxConnections > 0 {
				mc = fmt.Sprintf("max_connections %d", e.s.IdleMaxConnections)
			}
			r.Tried = fmt.Sprintf("%d idle sockets (half send nothing, half only the preamble) held %v with %s; a new client tries to log in every second: it may be refused with a reason, never reset, and must get in within %v",
				n, max(e.s.Duration, e.s.HandshakeWait+2*time.Second), mc, e.s.HandshakeWait)
			start := time.Now()
			socks := make([]net.Conn, n)
			states := make([]*sockState, n)
			var dialFail atomic.Int64
			var wg sync.WaitGroup
			var next atomic.Int64
			for w := 0; w < 16; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1) - 1)
						if i >= n || ctx.Err() != nil {
							return
						}
						nc, err := dialRaw(ctx, e.b.Addr, 0)
						if err != nil {
							dialFail.Add(1)
							continue
						}
						if i%2 == 1 {
							_, _ = nc.Write(wire.Preamble[:])
						}
						socks[i] = nc
						states[i] = watch(nc, start)
					}
				}()
			}
			wg.Wait()
			opened := time.Since(start)
			defer func() {
				for _, nc := range socks {
					if nc != nil {
						nc.Close()
					}
				}
			}()
			// A new client tries to log in every second. While the flood
			// holds the unauthenticated slots it may be refused, with a
			// CLOSE that says why; once the handshake deadline has closed
			// the flood's sockets it must get in.
			var ok, refused, broken int
			var worst time.Duration
			var lastFailAt time.Duration
			var firstBroken, firstRefusal string
			t := time.NewTicker(time.Second)
			defer t.Stop()
			hold := max(e.s.Duration, e.s.HandshakeWait+2*time.Second)
			end := start.Add(hold)
			for time.Now().Before(end) && ctx.Err() == nil {
				t0 := time.Now()
				nc, err := dialRaw(ctx, e.b.Addr, 0)
				if err == nil {
					_ = nc.SetDeadline(time.Now().Add(3 * time.Second))
					err = rawLogin(nc, "guest", "guest", 0)
					nc.Close()
				}
				at := time.Since(start)
				switch {
				case err == nil:
					ok++
					worst = max(worst, time.Since(t0))
				case errors.Is(err, errRefused):
					refused++
					lastFailAt = at
					if firstRefusal == "" {
						firstRefusal = fmt.Sprintf("%.1f s in: %v", at.Seconds(), err)
					}
				default:
					broken++
					lastFailAt = at
					if firstBroken == "" {
						firstBroken = fmt.Sprintf("%.1f s in: %v", at.Seconds(), err)
					}
				}
				select {
				case <-ctx.Done():
				case <-t.C:
				}
			}
			closedBy := 0
			reasons := map[string]int{}
			var closeTimes []time.Duration
			for _, st := range states {
				if st == nil || st.ended() == 0 {
					continue
				}
				closedBy++
				closeTimes = append(closeTimes, st.ended())
				reasons[st.closeReason()]++
			}
			r.notef("opened %d of %d in %.1f s (%d connects failed); %d closed by the broker during the hold (%s); how: %v",
				int64(n)-dialFail.Load(), n, opened.Seconds(), dialFail.Load(), closedBy, durStats(closeTimes), reasons)
			r.notef("new client logins, one a second for %v: %d ok (slowest %v), %d refused with a reason (first: %s), %d failed without one (first: %s)",
				hold, ok, worst.Round(time.Millisecond), refused, firstRefusal, broken, firstBroken)
			if broken > 0 {
				r.failf("%d new client logins failed without a CLOSE saying why (first: %s)", broken, firstBroken)
			}
			if lastFailAt > e.s.HandshakeWait {
				r.failf("new clients were still locked out %.1f s into the flood (bound %v: the handshake deadline and slack)",
					lastFailAt.Seconds(), e.s.HandshakeWait)
			}
		},
	}
}

// slowloris: sockets that send the preamble and a valid AUTH one byte at a
// time (issue 11 item 8; slowloris.py). None may log in; each must be
// closed within HandshakeWait.
func slowloris() Probe {
	return Probe{
		Name:         "slowloris",
		RSSAllowance: socketsAllowance,
		run: func(ctx context.Context, e *env, r *Result) {
			n := e.s.SlowlorisSockets
			msg := append(wire.Preamble[:0:0], wire.Preamble[:]...)
			msg = wire.AppendFrame(msg, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), Product: "slowloris"})
			r.Tried = fmt.Sprintf("%d sockets sending the preamble and a valid guest AUTH (%d bytes) one byte every %v; none may log in, each must be closed within %v",
				n, len(msg), e.s.SlowlorisByte, e.s.HandshakeWait)
			start := time.Now()
			type sock struct {
				nc net.Conn
				st *sockState
			}
			var socks []sock
			for i := 0; i < n; i++ {
				nc, err := dialRaw(ctx, e.b.Addr, 0)
				if err != nil {
					r.notef("connect failed: %v", err)
					continue
				}
				socks = append(socks, sock{nc, watch(nc, start)})
			}
			defer func() {
				for _, s := range socks {
					s.nc.Close()
				}
			}()
			t := time.NewTicker(e.s.SlowlorisByte)
			defer t.Stop()
			deadline := time.After(e.s.HandshakeWait)
			pos := 0
		loop:
			for {
				open := 0
				for _, s := range socks {
					if s.st.ended() != 0 || s.st.loggedIn.Load() {
						continue
					}
					open++
					if pos < len(msg) {
						_ = s.nc.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
						_, _ = s.nc.Write(msg[pos : pos+1])
					}
				}
				pos++
				if open == 0 {
					break
				}
				select {
				case <-ctx.Done():
					r.failf("stopped: %v", ctx.Err())
					return
				case <-deadline:
					break loop
				case <-t.C:
				}
			}
			var closed []time.Duration
			stillOpen, logged := 0, 0
			reasons := map[string]int{}
			for _, s := range socks {
				if s.st.loggedIn.Load() {
					logged++
					continue
				}
				if s.st.ended() == 0 {
					stillOpen++
					continue
				}
				closed = append(closed, s.st.ended())
				reasons[s.st.closeReason()]++
			}
			r.notef("%d of %d bytes sent; %d closed by the broker (%s), %d logged in, %d still open after %v; CLOSE reasons: %v",
				min(pos, len(msg)), len(msg), len(closed), durStats(closed), logged, stillOpen, e.s.HandshakeWait, reasons)
			if logged > 0 {
				r.failf("%d slowloris sockets completed a login", logged)
			}
			if stillOpen > 0 {
				r.failf("%d of %d slowloris sockets still open after %v", stillOpen, len(socks), e.s.HandshakeWait)
			}
		},
	}
}

// authStorm: AuthLoops parallel loops of logins with a wrong password for
// a bcrypt user (issue 11 item 14; authloop.py).
func authStorm() Probe {
	return Probe{
		Name:         "auth-storm",
		RSSAllowance: socketsAllowance,
		run: func(ctx context.Context, e *env, r *Result) {
			r.Tried = fmt.Sprintf("%d parallel loops of logins as a bcrypt user (cost 10) with a wrong password, for %v",
				e.s.AuthLoops, e.s.Duration)
			var mu sync.Mutex
			var lat []time.Duration
			var refused, accepted, cut int
			other := map[string]int{}
			start := time.Now()
			end := start.Add(e.s.Duration)
			var wg sync.WaitGroup
			for i := 0; i < e.s.AuthLoops; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for time.Now().Before(end) && ctx.Err() == nil {
						t0 := time.Now()
						nc, err := dialRaw(ctx, e.b.Addr, 0)
						if err == nil {
							// An attempt still waiting when the storm ends is
							// cut there (the broker may be slowing this source
							// down), not waited for.
							_ = nc.SetDeadline(end)
							err = rawLogin(nc, e.b.AppUser, "wrong-"+e.b.AppPassword, 0)
							nc.Close()
						}
						d := time.Since(t0)
						mu.Lock()
						var ne net.Error
						if errors.As(err, &ne) && ne.Timeout() && !time.Now().Before(end) {
							cut++
							mu.Unlock()
							continue
						}
						lat = append(lat, d)
						switch {
						case err == nil:
							accepted++
						case errors.Is(err, errRefused):
							refused++
						default:
							k := err.Error()
							if len(k) > 60 {
								k = k[:60]
							}
							other[k]++
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			el := time.Since(start)
			sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
			p50, mx := time.Duration(0), time.Duration(0)
			if len(lat) > 0 {
				p50, mx = lat[len(lat)/2], lat[len(lat)-1]
			}
			r.notef("%d attempts answered in %.1f s (%.0f/s): %d refused, %d accepted, other %v; latency p50 %v max %v; %d still waiting at the end",
				len(lat), el.Seconds(), float64(len(lat))/el.Seconds(), refused, accepted, other,
				p50.Round(time.Millisecond), mx.Round(time.Millisecond), cut)
			if accepted > 0 {
				r.failf("%d logins with a wrong password were accepted", accepted)
			}
		},
	}
}
