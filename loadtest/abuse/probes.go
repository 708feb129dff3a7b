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

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

// sockState is what a hand-driven socket has seen so far.
type sockState struct {
	endedNs  atomic.Int64 // from the socket's start; 0: still open
	loggedIn atomic.Bool  // OPEN_OK arrived
	mu       sync.Mutex
	reason   string // the CLOSE frame's, if one came
}

func (s *sockState) ended() time.Duration { return time.Duration(s.endedNs.Load()) }

// closeReason is the reason of the CLOSE the broker sent, or says there
// was none (a socket closed before the preamble gets no frame).
func (s *sockState) closeReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reason == "" {
		return "(no CLOSE: reset or EOF)"
	}
	return s.reason
}

// watch reads nc until the broker closes it (or it is closed here), keeping
// what it sees in the returned state.
func watch(nc net.Conn, start time.Time) *sockState {
	st := &sockState{}
	go func() {
		hdr := make([]byte, wire.HeaderSize)
		for {
			f, err := readFrame(nc, hdr, true)
			if err != nil {
				if !errors.Is(err, net.ErrClosed) {
					st.endedNs.Store(max(int64(time.Since(start)), 1))
				}
				return
			}
			switch f.typ {
			case wire.TypeOpenOK:
				st.loggedIn.Store(true)
			case wire.TypeClose:
				r, _ := f.closeReason()
				st.mu.Lock()
				st.reason = r
				st.mu.Unlock()
				_, _ = nc.Write(wire.AppendFrame(nil, 0, &wire.CloseOK{}))
			}
		}
	}()
	return st
}

// durStats summarises durations.
func durStats(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return fmt.Sprintf("min %.1f s, max %.1f s", ds[0].Seconds(), ds[len(ds)-1].Seconds())
}

// The RSS a probe that stays under the watermark may add to the baseline.
func allowance(n int64) func(Sizes) int64 { return func(Sizes) int64 { return n } }

// A few hundred sockets or a storm of short connections: 64 MiB, far
// above what they need; more is a leak.
var socketsAllowance = allowance(64 * MiB)

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

// flooder publishes as fast as the socket takes it on channel 1 and
// ignores FLOW (issue 11 item 10; pub.py ignore-flow, emptypub.py).
type flooder struct {
	sent, frames     atomic.Int64
	flowOffAt        atomic.Int64 // ns since start of the first FLOW(false); 0: none
	sentAtFlowOff    atomic.Int64
	confirmed        atomic.Int64
	closeReason      atomic.Value
	closedHere       atomic.Bool
	start            time.Time
	bytesSent        atomic.Int64
	bytesAfterFlowOf atomic.Int64
}

func (f *flooder) reader(nc net.Conn) {
	hdr := make([]byte, wire.HeaderSize)
	for {
		fr, err := readFrame(nc, hdr, false)
		if err != nil {
			if !f.closedHere.Load() && f.closeReason.Load() == nil {
				f.closeReason.Store(fmt.Sprintf("socket ended: %v", err))
			}
			return
		}
		switch fr.typ {
		case wire.TypeFlow:
			if b, ok := fr.body().(*wire.Flow); ok && !b.Active && f.flowOffAt.Load() == 0 {
				f.flowOffAt.Store(int64(time.Since(f.start)))
				f.sentAtFlowOff.Store(f.bytesSent.Load())
			}
		case wire.TypeConfirm:
			var cb wire.ConfirmBatch
			if wire.DecodeConfirm(wire.Frame{Type: fr.typ, Payload: fr.payload}, &cb) == nil {
				f.confirmed.Add(int64(cb.Count))
			}
		case wire.TypeClose:
			r, _ := fr.closeReason()
			f.closeReason.Store("CLOSE " + r)
		}
	}
}

// flood publishes frames of n messages with body size bodySize to queue q
// until ctx ends, then closes the socket and deletes q.
func flood(ctx context.Context, e *env, r *Result, q string, n, bodySize int) {
	nc, err := rawSession(ctx, e.b.Addr, "guest", "guest", 0, 0)
	if err != nil {
		r.failf("flooder login: %v", err)
		return
	}
	if err := rawDeclareQueue(nc, q, 2, nil); err != nil {
		r.failf("flooder declare: %v", err)
		nc.Close()
		return
	}
	f := &flooder{start: time.Now()}
	go f.reader(nc)
	body := make([]byte, bodySize)
	var frame []byte
	seq := uint64(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			buf, mark := wire.BeginPublish(frame[:0], 1, seq, nil)
			m := wire.Message{RoutingKey: []byte(q), Body: body}
			for i := 0; i < n; i++ {
				buf = wire.AppendMessage(buf, &m)
			}
			frame = mark.End(buf, uint32(n))
			if _, err := nc.Write(frame); err != nil {
				return
			}
			seq += uint64(n)
			f.frames.Add(1)
			f.sent.Add(int64(n))
			f.bytesSent.Add(int64(len(frame)))
		}
	}()
	select {
	case <-ctx.Done():
	case <-done:
	}
	el := time.Since(f.start)
	f.closedHere.Store(true)
	nc.Close()
	<-done
	flowAt := "never"
	if at := f.flowOffAt.Load(); at > 0 {
		flowAt = fmt.Sprintf("%.2f s in, after %s sent; %s sent after it",
			time.Duration(at).Seconds(), mb(f.sentAtFlowOff.Load()), mb(f.bytesSent.Load()-f.sentAtFlowOff.Load()))
	}
	closed := "no"
	if v := f.closeReason.Load(); v != nil {
		closed = v.(string)
	}
	r.notef("flooder sent %d messages (%s in %d frames) in %.1f s, %d confirmed; FLOW(false) %s; closed by the broker: %s",
		f.sent.Load(), mb(f.bytesSent.Load()), f.frames.Load(), el.Seconds(), f.confirmed.Load(), flowAt, closed)
	// Delete the flood's queue, as an operator would, so the pair can resume.
	dctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	t0 := time.Now()
	c, err := client.Dial(dctx, e.b.URL())
	if err != nil {
		r.failf("could not connect to delete the flood queue: %v", err)
		return
	}
	defer c.Close()
	ch, err := c.Channel(dctx)
	if err == nil {
		_, err = ch.DeleteQueue(dctx, q, false, false)
	}
	if err != nil {
		r.failf("deleting the flood queue: %v", err)
		return
	}
	r.notef("flood queue deleted in %v", time.Since(t0).Round(time.Millisecond))
}

func flowIgnorer() Probe {
	return Probe{
		Name:   "flow-ignoring-publisher",
		Memory: true,
		run: func(ctx context.Context, e *env, r *Result) {
			r.Tried = fmt.Sprintf("one connection publishing 1 KiB messages (1,000 per frame) to a queue without consumers as fast as the socket takes them, ignoring FLOW, for %v; then its queue is deleted",
				e.s.Duration)
			fctx, cancel := context.WithTimeout(ctx, e.s.Duration)
			defer cancel()
			flood(fctx, e, r, "abuse.flow", 1000, 1024)
		},
	}
}

func emptyBodyFlood() Probe {
	return Probe{
		Name:   "empty-body-flood",
		Memory: true,
		run: func(ctx context.Context, e *env, r *Result) {
			const q = "abuse.empty"
			per := (4<<20 - 1024) / (9 + len(q))
			r.Tried = fmt.Sprintf("one connection publishing empty-body messages (%d per 4 MiB frame) to a queue without consumers, ignoring FLOW, for %v; then its queue is deleted",
				per, e.s.Duration)
			fctx, cancel := context.WithTimeout(ctx, e.s.Duration)
			defer cancel()
			flood(fctx, e, r, q, per, 0)
		},
	}
}

// feederWindow is the stalled consumers' feeder's confirm window.
const feederWindow = 1000

// stalledMaxLength bounds the stalled consumers' queue, so what the broker
// holds beyond it is what it has taken out of the queue for them.
const stalledMaxLength = 1000

// stalledAutoAck: consumers that subscribe with auto-ack and never read
// their socket (kernel receive buffer 4 KiB), while a well-behaved feeder
// publishes to their queue (issue 11 item 11; deadconsumer.py).
func stalledAutoAck() Probe {
	return Probe{
		Name:         "stalled-auto-ack",
		RSSAllowance: func(s Sizes) int64 { return s.StalledAllowance },
		run: func(ctx context.Context, e *env, r *Result) {
			const q = "abuse.stall"
			n := e.s.StalledConsumers
			r.Tried = fmt.Sprintf("%d auto-ack consumers (prefetch 0, SO_RCVBUF 4 KiB) that never read, on one queue (max-length %d, drop-head: no backlog of its own) fed %d × 1 KiB msg/s for %v by a publisher with confirms; what the broker holds for them must stay within %s",
				n, stalledMaxLength, e.s.FeederRate, e.s.Duration, mb(e.s.StalledAllowance))
			var socks []net.Conn
			defer func() {
				for _, nc := range socks {
					nc.Close()
				}
			}()
			for i := 0; i < n; i++ {
				nc, err := rawSession(ctx, e.b.Addr, "guest", "guest", 0, 4096)
				if err != nil {
					r.failf("stalled consumer %d: %v", i, err)
					return
				}
				socks = append(socks, nc)
				args := wire.Table{{Key: "max-length", Value: wire.Int(stalledMaxLength)}}
				if err := rawDeclareQueue(nc, q, 2, args); err != nil {
					r.failf("stalled consumer %d declare: %v", i, err)
					return
				}
				if _, err := nc.Write(wire.AppendFrame(nil, 1, &wire.Subscribe{Req: 3, Queue: q, AutoAck: true})); err != nil {
					r.failf("stalled consumer %d subscribe: %v", i, err)
					return
				}
			}
			c, err := client.Dial(ctx, e.b.URL(), client.Options{ConfirmWindow: feederWindow})
			if err != nil {
				r.failf("feeder: %v", err)
				return
			}
			defer c.Close()
			ch, err := c.Channel(ctx)
			if err != nil {
				r.failf("feeder: %v", err)
				return
			}
			var confirmed atomic.Int64
			ch.NotifyConfirm(func(first, last uint64, err error) {
				if err == nil {
					confirmed.Add(int64(last - first + 1))
				}
			})
			body := make([]byte, 1024)
			fctx, cancel := context.WithTimeout(ctx, e.s.Duration)
			defer cancel()
			start := time.Now()
			sent := 0
			for fctx.Err() == nil {
				due := int(time.Since(start).Seconds() * float64(e.s.FeederRate))
				for ; sent < due && fctx.Err() == nil; sent++ {
					if _, err := ch.PublishAsync(fctx, "", client.Message{RoutingKey: q, Body: body}); err != nil {
						break
					}
				}
				time.Sleep(5 * time.Millisecond)
			}
			wctx, wcancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = ch.WaitConfirms(wctx)
			wcancel()
			info, derr := ch.DeclareQueue(ctx, q, client.QueueOptions{Passive: true, Args: wire.Table{{Key: "max-length", Value: wire.Int(stalledMaxLength)}}})
			// Which stalled sockets did the broker close?
			cut := 0
			for _, nc := range socks {
				_ = nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
				buf := make([]byte, 64<<10)
				for {
					_, err := nc.Read(buf)
					if err == nil {
						continue
					}
					var ne net.Error
					if !(errors.As(err, &ne) && ne.Timeout()) {
						cut++
					}
					break
				}
			}
			left := "unknown"
			if derr == nil {
				left = fmt.Sprintf("%d", info.Messages)
			}
			r.notef("feeder published %d, %d confirmed; %s left in the queue; %d of %d stalled consumers cut off by the broker",
				sent, confirmed.Load(), left, cut, n)
		},
	}
}

// declareStorm: Declares queue declares and then as many binds, pipelined
// on one connection that keeps its heartbeats (issue 11 item 12; decl.py).
func declareStorm() Probe {
	return Probe{
		Name: "declare-storm",
		// Ten thousand queues and bindings: 256 MiB.
		RSSAllowance: allowance(256 * MiB),
		run: func(ctx context.Context, e *env, r *Result) {
			n := e.s.Declares
			r.Tried = fmt.Sprintf("%d queue declares, then %d binds, pipelined on one connection (heartbeats every second); the pair may not go %v without a delivery",
				n, n, e.s.MaxGap)
			nc, err := rawSession(ctx, e.b.Addr, "guest", "guest", 0, 0)
			if err != nil {
				r.failf("login: %v", err)
				return
			}
			defer nc.Close()
			if _, err := nc.Write(wire.AppendFrame(nil, 1, &wire.ExchangeDeclare{Req: 2, Name: "abuse.decl", Kind: wire.ExchangeDirect})); err != nil {
				r.failf("exchange declare: %v", err)
				return
			}
			if _, err := expectReply(nc, 2); err != nil {
				r.failf("exchange declare: %v", err)
				return
			}
			var wmu sync.Mutex
			write := func(b []byte) error {
				wmu.Lock()
				defer wmu.Unlock()
				_, err := nc.Write(b)
				return err
			}
			stopHB := make(chan struct{})
			defer close(stopHB)
			go func() {
				t := time.NewTicker(time.Second)
				defer t.Stop()
				hb := wire.AppendFrame(nil, 0, &wire.Heartbeat{})
				for {
					select {
					case <-stopHB:
						return
					case <-t.C:
						if write(hb) != nil {
							return
						}
					}
				}
			}()
			start := time.Now()
			var declaredAt, boundAt time.Duration
			var errs, replies int
			var firstErr string
			var repliesSeen atomic.Int64 // for the timeout message
			readDone := make(chan error, 1)
			go func() {
				hdr := make([]byte, wire.HeaderSize)
				for replies < 2*n {
					f, err := readFrame(nc, hdr, true)
					if err != nil {
						readDone <- err
						return
					}
					switch b := f.body().(type) {
					case *wire.QueueDeclareOK:
						replies++
					case *wire.OKReply:
						replies++
					case *wire.ErrorReply:
						replies++
						errs++
						if firstErr == "" {
							firstErr = fmt.Sprintf("%v %s", b.Code, b.Message)
						}
					case *wire.Close:
						readDone <- fmt.Errorf("CLOSE %v %s", b.Code, b.Reason)
						return
					case *wire.ChannelClose:
						readDone <- fmt.Errorf("CHANNEL_CLOSE %v %s", b.Code, b.Reason)
						return
					default:
						continue
					}
					repliesSeen.Store(int64(replies))
					if replies == n {
						declaredAt = time.Since(start)
					}
				}
				boundAt = time.Since(start)
				readDone <- nil
			}()
			go func() {
				var buf []byte
				flush := func() bool {
					err := write(buf)
					buf = buf[:0]
					return err == nil
				}
				for i := 0; i < n; i++ {
					buf = wire.AppendFrame(buf, 1, &wire.QueueDeclare{Req: uint32(100 + i), Name: fmt.Sprintf("abuse.decl.%d", i)})
					if len(buf) > 32<<10 && !flush() {
						return
					}
				}
				for i := 0; i < n; i++ {
					buf = wire.AppendFrame(buf, 1, &wire.Bind{Req: uint32(100 + n + i), Destination: fmt.Sprintf("abuse.decl.%d", i),
						Source: "abuse.decl", RoutingKey: fmt.Sprintf("k%d", i)})
					if len(buf) > 32<<10 && !flush() {
						return
					}
				}
				flush()
			}()
			limit := 4*e.s.Duration + 60*time.Second
			select {
			case err := <-readDone:
				if err != nil {
					r.failf("the storm's connection ended after %.1f s, %d of %d replies: %v", time.Since(start).Seconds(), repliesSeen.Load(), 2*n, err)
					return
				}
			case <-time.After(limit):
				r.failf("the storm was not answered within %v (%d of %d replies)", limit, repliesSeen.Load(), 2*n)
				return
			case <-ctx.Done():
				r.failf("stopped: %v", ctx.Err())
				return
			}
			r.notef("%d declares answered in %.2f s, all %d replies in %.2f s; %d errors %s", n, declaredAt.Seconds(), 2*n,
				boundAt.Seconds(), errs, firstErr)
			if errs > 0 {
				r.failf("%d declares or binds failed (first: %s)", errs, firstErr)
			}
		},
	}
}
