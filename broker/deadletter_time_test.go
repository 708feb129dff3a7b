package broker

import (
	"context"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// TestDeadLetterTimeIsTheCommandTime: the death record's time is the time
// the shard stamped on the work it is doing (the now every queue machine
// sees), not a second reading of the wall clock: a replica applying the
// same commands must write the same history. The shard's time is set to
// a fake one (1970) that no clock would read.
func TestDeadLetterTimeIsTheCommandTime(t *testing.T) {
	const fakeNowMs = 1_000
	s := startBroker(t, Config{Clock: func() int64 { return fakeNowMs }})
	var err error
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(s.DeclareExchange(wire.ExchangeDeclare{Name: "dlx", Kind: wire.ExchangeFanout}))
	_, err = s.DeclareQueue(wire.QueueDeclare{Name: "dead"})
	must(err)
	must(s.Bind(wire.Bind{Source: "dlx", Destination: "dead"}))
	_, err = s.DeclareQueue(wire.QueueDeclare{Name: "src", Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}}})
	must(err)
	q := s.topo.lookupQueue("src")
	msg := (&Arena{}).add(nil, []byte("src"), wire.AppendProperties(nil, &wire.Properties{})[2:], []byte("m"), 0, 0)
	msg.Arena.Refs.Store(1)

	// Publish one message to src, take it and reject it: it dies at the
	// time the shard stamped on the reject (the fake clock's).
	k := &recSink{}
	const id = queue.ConsumerID(1 << 40)
	q.shard.submit(Command{Kind: CmdPublish, Items: []EnqItem{{Q: q, Msg: msg, Meta: queue.Message{Size: 1}}}})
	q.shard.submit(Command{Kind: CmdSubscribe, Queue: q, Sink: k, Spec: queue.ConsumerSpec{ID: id, Owner: 1, Prefetch: 1}})
	_, err = ask(ctx, q.shard, Command{Kind: CmdBarrier})
	must(err)
	k.mu.Lock()
	if len(k.delivers) != 1 || len(k.delivers[0]) != 1 {
		k.mu.Unlock()
		t.Fatalf("deliveries %v, want one", sizes(k.delivers))
	}
	qtag := k.delivers[0][0].QTag
	k.mu.Unlock()
	q.shard.submit(Command{Kind: CmdSettle, Settles: []SettleItem{{Q: q, Consumer: id, Op: wire.SettleReject, QTag: qtag}}})
	_, err = ask(ctx, q.shard, Command{Kind: CmdBarrier})
	must(err)
	// The dead letter was submitted to dead's shard before this peek.
	got, err := s.PeekQueue(ctx, "dead", 1)
	must(err)
	if len(got) != 1 || got[0].Properties == nil || len(got[0].Properties.Deaths) != 1 {
		t.Fatalf("dead-letter queue holds %+v, want one message with one death", got)
	}
	if d := got[0].Properties.Deaths[0]; d.FirstMs != fakeNowMs || d.LastMs != fakeNowMs {
		t.Fatalf("death recorded at first_ms %d last_ms %d, want the shard's time %d", d.FirstMs, d.LastMs, fakeNowMs)
	}
}
