package client_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

type batchSeen struct {
	tag         uint64
	redelivered bool
	body        string
	kept        []byte // the Body slice itself, kept past the handler (breaking the rule on purpose)
}

// TestConsumeBatch: ConsumeBatch hands deliveries over without copying.
// Bodies are right during the handler, tags are the channel's delivery
// tags in order, a message nacked with requeue comes back Redelivered, an
// AckMultiple of a batch's last delivery settles the batch, and a body kept
// past the handler is overwritten (poisoned with 0xDB, as -tags warrendebug
// does) so breaking the rule shows.
func TestConsumeBatch(t *testing.T) {
	defer client.SetPoisonReleased(true)()
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(s))
	must(t, err)
	defer c.Close()
	ch, err := c.Channel(ctx)
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "batch", client.QueueOptions{})
	must(t, err)
	const n = 20
	for i := 0; i < n; i++ {
		must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "batch", Body: []byte(fmt.Sprintf("m%02d", i))}))
	}
	sub, err := c.Channel(ctx)
	must(t, err)
	seen := make(chan batchSeen, 4*n)
	nacked := false
	cs, err := sub.ConsumeBatch(ctx, "batch", client.ConsumeOptions{Prefetch: 100}, func(ds []client.Delivery) {
		for i := range ds {
			d := &ds[i]
			if d.RoutingKey != "batch" || d.Exchange != "" {
				t.Errorf("delivery %d: exchange %q routing key %q", d.Tag, d.Exchange, d.RoutingKey)
			}
			seen <- batchSeen{tag: d.Tag, redelivered: d.Redelivered, body: string(d.Body), kept: d.Body}
			if string(d.Body) == "m03" && !nacked {
				nacked = true
				if err := d.Nack(true); err != nil {
					t.Error(err)
				}
				continue
			}
			if i == len(ds)-1 {
				if err := d.AckMultiple(); err != nil {
					t.Error(err)
				}
			}
		}
	})
	must(t, err)
	var got []batchSeen
	for len(got) < n+1 {
		select {
		case b := <-seen:
			got = append(got, b)
		case <-ctx.Done():
			t.Fatalf("got %d deliveries, want %d", len(got), n+1)
		}
	}
	must(t, cs.Cancel(ctx))
	for i, b := range got[:n] {
		if want := fmt.Sprintf("m%02d", i); b.body != want || b.tag != uint64(i+1) || b.redelivered {
			t.Errorf("delivery %d: body %q tag %d redelivered %v; want %q tag %d first delivery", i, b.body, b.tag, b.redelivered, want, i+1)
		}
	}
	if last := got[n]; last.body != "m03" || !last.redelivered || last.tag != n+1 {
		t.Errorf("after the nack: body %q tag %d redelivered %v; want m03 tag %d redelivered", last.body, last.tag, last.redelivered, n+1)
	}
	// The handler has returned for every batch: a body kept past it is gone.
	for _, b := range got {
		if !bytes.Equal(b.kept, bytes.Repeat([]byte{0xDB}, len(b.kept))) {
			t.Errorf("tag %d: a body kept past its handler still reads %q; want it poisoned", b.tag, b.kept)
		}
	}
	// Everything was settled: the queue is empty.
	info, err := ch.DeclareQueue(ctx, "batch", client.QueueOptions{Passive: true})
	must(t, err)
	if info.Messages != 0 {
		t.Errorf("queue holds %d messages after the batch acks; want 0", info.Messages)
	}
}

// TestConsumeBatchBufferReused: without the debug poisoning, the reader
// reuses its buffer for the next frames (no fresh read buffer every 256 KiB),
// so a body kept past its ConsumeBatch handler is overwritten by a later
// delivery: breaking the rule shows in an ordinary build too. Prefetch 1
// on a connection that only consumes: each delivery is read after the
// previous frame was handled.
func TestConsumeBatchBufferReused(t *testing.T) {
	defer client.SetPoisonReleased(false)()
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pc, err := client.Dial(ctx, warrentest.URL(s))
	must(t, err)
	defer pc.Close()
	ch, err := pc.Channel(ctx)
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "reuse", client.QueueOptions{})
	must(t, err)
	// Long bodies: the later frames, read from the start of the buffer,
	// cover where the first body was wherever it sat in its read.
	body := func(i int) string { return strings.Repeat(fmt.Sprintf("m%02d.", i), 100) }
	for i := 0; i < 3; i++ {
		must(t, ch.Publish(ctx, "", client.Message{RoutingKey: "reuse", Body: []byte(body(i))}))
	}
	cc, err := client.Dial(ctx, warrentest.URL(s))
	must(t, err)
	defer cc.Close()
	sub, err := cc.Channel(ctx)
	must(t, err)
	// The handler runs on the reader goroutine: it keeps the first body
	// (breaking the rule on purpose) and, in the third call, reports what
	// that kept slice reads by then.
	var first []byte
	calls := 0
	later := make(chan string, 1)
	_, err = sub.ConsumeBatch(ctx, "reuse", client.ConsumeOptions{Prefetch: 1}, func(ds []client.Delivery) {
		for i := range ds {
			if calls++; calls == 1 {
				first = ds[i].Body
			}
			// Acked before the third call reports: the test ends (and
			// closes this connection) once it has.
			if err := ds[i].Ack(); err != nil {
				t.Error(err)
			}
			if calls == 3 {
				later <- string(first)
			}
		}
	})
	must(t, err)
	select {
	case got := <-later:
		if got == body(0) {
			t.Errorf("the first body, kept past its handler, still reads %.12q…: the read buffer was not reused", got)
		}
	case <-ctx.Done():
		t.Fatal("the third delivery never came")
	}
}
