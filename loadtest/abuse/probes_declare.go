package abuse

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/wire"
)

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
