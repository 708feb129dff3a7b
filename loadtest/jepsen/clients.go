package jepsen

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/loadtest"
	"github.com/warren-mq/warren/wire"
)

// clients are the producers and consumers of one class's run.
type clients struct {
	cfg    *Config
	hist   *loadtest.History
	urls   func() []string // the nodes' URLs (a random one per connection)
	queues []string

	// Per producer and consumer: the last confirm and the last delivery
	// (UnixNano), for recovery times.
	lastConfirm []atomic.Int64
	lastDeliver []atomic.Int64
	reconnects  atomic.Int64
	cancels     atomic.Int64
	requeues    atomic.Int64

	prodWG, consWG sync.WaitGroup
}

func (c *clients) url(r *rand.Rand) string {
	us := c.urls()
	return us[r.IntN(len(us))]
}

// backoff waits a little before a reconnect (or returns false once ctx ends).
func backoff(ctx context.Context, r *rand.Rand) bool {
	t := time.NewTimer(time.Duration(20+r.IntN(80)) * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// produce publishes persistent messages with confirms at cfg.Rate per
// second until ctx ends, reconnecting to a random node whenever the
// connection goes; then it waits up to settle for its last confirms.
func (c *clients) produce(ctx context.Context, id int, seed uint64, settle time.Duration) {
	defer c.prodWG.Done()
	r := rand.New(rand.NewPCG(seed, uint64(id)))
	var seq uint64
	perTick := max(1, c.cfg.Rate/100)
	for ctx.Err() == nil {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := client.Dial(dctx, c.url(r), client.Options{Name: "warren-jepsen", ConfirmWindow: 2000})
		cancel()
		if err != nil {
			if !backoff(ctx, r) {
				return
			}
			continue
		}
		ch, err := conn.Channel(ctx)
		if err != nil {
			conn.Close()
			continue
		}
		// Channel sequence numbers count from 1 in publish order; chanSeqs
		// maps them to this producer's.
		var mu sync.Mutex
		var chanSeqs []uint64
		ch.NotifyConfirm(func(first, last uint64, err error) {
			if errors.Is(err, client.ErrConnectionLost) {
				return // unknown: it may or may not be enqueued
			}
			mu.Lock()
			defer mu.Unlock()
			for s := first; s <= last && s <= uint64(len(chanSeqs)); s++ {
				ps := chanSeqs[s-1]
				c.hist.Confirmed(id, ps, ps, err == nil)
			}
			if err == nil {
				c.lastConfirm[id].Store(time.Now().UnixNano())
			}
		})
		tick := time.NewTicker(10 * time.Millisecond)
		broken := false
		for !broken && ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-tick.C:
				for i := 0; i < perTick && !broken; i++ {
					seq++
					q := c.queues[int(seq)%len(c.queues)]
					c.hist.Sent(id, seq)
					body := c.hist.Body(id, seq)
					mu.Lock()
					chanSeqs = append(chanSeqs, seq)
					mu.Unlock()
					cs, err := ch.PublishAsync(ctx, "", client.Message{RoutingKey: q, Body: body, Persistent: true})
					if err != nil {
						broken = true
						break
					}
					if cs != uint64(len(chanSeqs)) {
						panic("jepsen: channel sequence numbers are not consecutive")
					}
				}
			}
		}
		tick.Stop()
		if !broken {
			wctx, cancel := context.WithTimeout(context.Background(), settle)
			_ = ch.WaitConfirms(wctx)
			cancel()
		}
		conn.Close()
		if ctx.Err() == nil {
			c.reconnects.Add(1)
			backoff(ctx, r)
		}
	}
}

// consume takes messages from queue until ctx ends: it checks every body,
// acks most (a consumption), requeues some, and now and then cancels and
// resubscribes or drops its connection and reconnects, to a random node
// (in a cluster a node that does not lead the queue serves its consumers
// from the leader).
func (c *clients) consume(ctx context.Context, id int, queue string, seed uint64, chaos *atomic.Bool) {
	defer c.consWG.Done()
	r := rand.New(rand.NewPCG(seed, uint64(1000+id)))
	for ctx.Err() == nil {
		u := c.url(r)
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := client.Dial(dctx, u, client.Options{Name: "warren-jepsen"})
		cancel()
		if err != nil {
			if !backoff(ctx, r) {
				return
			}
			continue
		}
		c.session(ctx, conn, id, queue, r, chaos)
		conn.Close()
		if ctx.Err() == nil {
			c.reconnects.Add(1)
			backoff(ctx, r)
		}
	}
}

// session consumes on one connection until it breaks, ctx ends or the
// chaos decides to reconnect.
func (c *clients) session(ctx context.Context, conn *client.Conn, id int, queue string, r *rand.Rand, chaos *atomic.Bool) {
	ch, err := conn.Channel(ctx)
	if err != nil {
		return
	}
	reconnectAt := time.Now().Add(time.Duration(2000+r.IntN(4000)) * time.Millisecond)
	for ctx.Err() == nil {
		cs, err := ch.Consume(ctx, queue, client.ConsumeOptions{Prefetch: 100})
		if err != nil {
			return
		}
		cancelAt := time.Now().Add(time.Duration(500+r.IntN(2000)) * time.Millisecond)
		tick := time.NewTicker(50 * time.Millisecond)
	loop:
		for {
			select {
			case <-ctx.Done():
				break loop
			case d, ok := <-cs.Deliveries():
				if !ok {
					tick.Stop()
					return // the connection or the consumer ended
				}
				pid, seq, valid := c.hist.Check(d.Body)
				if chaos.Load() && r.IntN(100) < 3 {
					if d.Nack(true) == nil {
						c.requeues.Add(1)
					}
					continue
				}
				if d.Ack() != nil {
					tick.Stop()
					return
				}
				if valid {
					c.hist.Consumed(pid, seq)
				}
				c.lastDeliver[id].Store(time.Now().UnixNano())
			case <-tick.C:
				if !chaos.Load() {
					continue
				}
				if time.Now().After(reconnectAt) {
					tick.Stop()
					return
				}
				if time.Now().After(cancelAt) {
					break loop
				}
			}
		}
		tick.Stop()
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err = cs.Cancel(cctx)
		cancel()
		if err != nil && wire.CodeOf(err) == 0 {
			return
		}
		c.cancels.Add(1)
	}
}
