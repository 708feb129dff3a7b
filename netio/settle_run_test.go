package netio_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestAckMultipleAcrossInterleavedConsumers: one channel, two consumers
// on queue a and one on b, their deliveries interleaved in the channel's
// tags (onSettle makes one run per consumer of a multiple ack). A tag acked
// alone, then a multiple ack to the eighth tag, settles exactly the first
// eight deliveries, whichever consumer and queue had them; a second
// multiple ack settles the rest.
func TestAckMultipleAcrossInterleavedConsumers(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	pub := channel(t, dial(t, s))
	var css []*client.Consumer
	for _, q := range []string{"a", "a", "b"} {
		if _, err := ch.DeclareQueue(ctx, q, client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		cs, err := ch.Consume(ctx, q, client.ConsumeOptions{Prefetch: 100})
		if err != nil {
			t.Fatal(err)
		}
		css = append(css, cs)
	}
	for i := range 12 {
		q := []string{"a", "b", "a"}[i%3]
		if err := pub.Publish(ctx, "", client.Message{RoutingKey: q, Body: []byte(fmt.Sprint(i))}); err != nil {
			t.Fatal(err)
		}
	}
	type got struct {
		d *client.Delivery
		q string
	}
	var ds []got
	for i, n := range []int{4, 4, 4} { // a round-robins its 8 between two consumers
		for range n {
			ds = append(ds, got{recv(t, css[i]), []string{"a", "a", "b"}[i]})
		}
	}
	slices.SortFunc(ds, func(x, y got) int { return int(x.d.Tag) - int(y.d.Tag) })
	want := map[string]int64{}
	for _, g := range ds[:8] {
		want[g.q]++
	}
	if err := ds[2].d.Ack(); err != nil {
		t.Fatal(err)
	}
	if err := ds[7].d.AckMultiple(); err != nil {
		t.Fatal(err)
	}
	applied(t, s, ch)
	for _, q := range []string{"a", "b"} {
		total := map[string]int64{"a": 8, "b": 4}[q]
		if st := queueStats(s, q); int64(st.Acked) != want[q] || st.Unacked != total-want[q] || st.Ready != 0 {
			t.Errorf("queue %s after acking tags 1..8: acked %d unacked %d ready %d, want %d %d 0", q, st.Acked, st.Unacked, st.Ready, want[q], total-want[q])
		}
	}
	if err := ds[11].d.AckMultiple(); err != nil {
		t.Fatal(err)
	}
	applied(t, s, ch)
	for _, q := range []string{"a", "b"} {
		if st := queueStats(s, q); st.Unacked != 0 || st.Ready != 0 {
			t.Errorf("queue %s after acking all: unacked %d ready %d, want 0 0", q, st.Unacked, st.Ready)
		}
	}
}
