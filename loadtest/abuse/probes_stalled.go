package abuse

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

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
