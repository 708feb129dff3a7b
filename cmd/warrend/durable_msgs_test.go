package main

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
)

// TestDurableMessagesSurviveKill9: every persistent message to a durable
// queue whose publish was confirmed is there after a kill -9 of warrend;
// those delivered and unacked come back redelivered (m005..m014: the five
// acks let five more out to the consumer), those acked (their acks on
// disk: a later confirm covers them) do not.
func TestDurableMessagesSurviveKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts warrend processes")
	}
	data := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, addr := startChild(t, data)
	conn, err := client.Dial(ctx, "warren://guest:guest@"+addr)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "work", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	const n = 200
	var ms []client.Message
	for i := range n {
		ms = append(ms, client.Message{RoutingKey: "work", Body: []byte(fmt.Sprintf("m%03d", i)), Persistent: true})
	}
	if err := ch.PublishBatch(ctx, "", ms); err != nil {
		t.Fatal(err)
	}
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		select {
		case d := <-cs.Deliveries():
			if i < 5 {
				if err := d.Ack(); err != nil {
					t.Fatal(err)
				}
			}
		case <-ctx.Done():
			t.Fatal("no delivery before the kill")
		}
	}
	// Confirmed after the acks: their entry is on disk before this one.
	if err := ch.Publish(ctx, "", client.Message{RoutingKey: "work", Body: []byte("last"), Persistent: true}); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	conn.Close()

	_, addr = startChild(t, data)
	conn, err = client.Dial(ctx, "warren://guest:guest@"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err = conn.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ch.DeclareQueue(ctx, "work", client.QueueOptions{Passive: true})
	if err != nil {
		t.Fatal(err)
	}
	if q.Messages != n-5+1 {
		t.Errorf("after kill -9 the queue holds %d messages, want %d (%d confirmed, 5 acked, 1 more)", q.Messages, n-5+1, n)
	}
	cs, err = ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for i := 5; i <= n; i++ {
		want := fmt.Sprintf("m%03d", i)
		if i == n {
			want = "last"
		}
		select {
		case d := <-cs.Deliveries():
			if string(d.Body) != want || d.Redelivered != (i < 15) || !d.Persistent {
				t.Fatalf("delivery %d after kill -9: %q redelivered %v persistent %v, want %q redelivered %v", i-5, d.Body, d.Redelivered, d.Persistent, want, i < 15)
			}
		case <-ctx.Done():
			t.Fatalf("delivery %d (%s) did not come after kill -9", i-5, want)
		}
	}
}
