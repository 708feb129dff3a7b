package abuse

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

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
