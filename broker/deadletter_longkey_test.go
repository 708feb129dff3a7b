package broker

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// TestPublishOneLongRoutingKey: the operator's publish (the admin API's
// POST /api/exchanges/{name}/publish) took a routing key of any length,
// where the protocols' are at most 255 bytes. Such a message in a queue
// with a dead-letter exchange panicked the shard when it died (its death
// record holds the key as a short string): warrend exited, and with the
// message in a durable queue's log it exited again at every start, as the
// message expired or was rejected again. PublishOne refuses the key; a
// message that an older version logged with one is dropped as too large
// when it dies (counted, logged), not dead-lettered.
func TestPublishOneLongRoutingKey(t *testing.T) {
	var dropped [NumDLDrops]atomic.Int64
	s := startBroker(t, Config{DeadLetterDropped: func(r DLDrop) { dropped[r].Add(1) }})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must := mustFunc(t)
	declareDeadLetterQueue(t, s)
	must(s.DeclareExchange(wire.ExchangeDeclare{Name: "fx", Kind: wire.ExchangeFanout}))
	_, err := s.DeclareQueue(wire.QueueDeclare{Name: "src", Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String("dlx")}}})
	must(err)
	must(s.Bind(wire.Bind{Source: "fx", Destination: "src"}))
	props := wire.AppendProperties(nil, nil)[2:]

	long := strings.Repeat("k", wire.MaxNameLen+1)
	_, err = s.PublishOne(ctx, "fx", long, props, []byte("m"), 0)
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.InvalidArgument || !strings.Contains(we.Reason, "routing key") {
		t.Fatalf("a publish with a routing key of %d bytes: %v, want invalid_argument", len(long), err)
	}
	if n, err := s.PublishOne(ctx, "fx", long[:wire.MaxNameLen], props, []byte("m"), 0); err != nil || n != 1 {
		t.Fatalf("a publish with a routing key of %d bytes: %d queues, %v", wire.MaxNameLen, n, err)
	}

	// As an older version stored it: taken and rejected, it dies.
	q := s.topo.lookupQueue("src")
	msg := (&Arena{}).add([]byte("fx"), []byte(long), props, []byte("m"), 0, 0)
	msg.Arena.Refs.Store(1)
	k := &recSink{}
	const id = queue.ConsumerID(1 << 40)
	if n, err := s.PurgeQueue(ctx, "src"); err != nil || n != 1 {
		t.Fatalf("purged %d (%v), want the one message published", n, err)
	}
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
	if n := dropped[dlTooLarge].Load(); n != 1 {
		t.Fatalf("dead letters dropped as too large: %d, want 1", n)
	}
	if got, err := s.PeekQueue(ctx, "dlq", 10); err != nil || len(got) != 0 {
		t.Fatalf("the dead-letter queue holds %d messages (%v), want none", len(got), err)
	}
}

// TestPublishOneInVhostStoresLocalExchange: the operator's publish in a
// vhost routes through the exchange's internal name ("v1" VhostSep "fx")
// but stores the name the vhost's clients use, as the fronts do: it
// stored the internal one, which AMQP and native consumers were handed
// as the message's exchange (seen with pika: 'v1\x1ffx'), and which a
// death record kept, so a dlq replay looked for an exchange in no vhost.
func TestPublishOneInVhostStoresLocalExchange(t *testing.T) {
	s := startBroker(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	must := mustFunc(t)
	must(s.PutVhost(ctx, MetaVhost{Name: "v1"}))
	fx, q := QualifyName("v1", "fx"), QualifyName("v1", "q")
	must(s.DeclareExchange(wire.ExchangeDeclare{Name: fx, Kind: wire.ExchangeFanout}))
	_, err := s.DeclareQueue(wire.QueueDeclare{Name: q})
	must(err)
	must(s.Bind(wire.Bind{Source: fx, Destination: q}))
	if n, err := s.PublishOne(ctx, fx, "r", wire.AppendProperties(nil, nil)[2:], []byte("m"), 0); err != nil || n != 1 {
		t.Fatalf("publish: %d queues, %v", n, err)
	}
	got, err := s.PeekQueue(ctx, q, 1)
	must(err)
	if len(got) != 1 || got[0].Exchange != "fx" {
		t.Fatalf("the queue holds %+v, want one message from exchange \"fx\"", got)
	}
}
