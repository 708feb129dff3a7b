package netio_test

import (
	"strings"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/internal/syncbuf"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestDeadLetterDropsAreCountedAndLogged: a dead letter that goes nowhere
// (its dead-letter exchange is missing, routes it nowhere, or it cannot
// carry its death history) is not counted as dead-lettered; it is counted
// as dropped, per queue and broker-wide by reason, and logged. The broker
// stays up.
func TestDeadLetterDropsAreCountedAndLogged(t *testing.T) {
	var logs syncbuf.Buffer
	s := warrentest.StartServer(t, &netio.Config{Logger: logTo(&logs)})
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "nobody-bound", "direct", client.ExchangeOptions{}))
	must(t, ch.DeclareExchange(ctx, "dlx", "fanout", client.ExchangeOptions{}))
	_, err := ch.DeclareQueue(ctx, "dead", client.QueueOptions{})
	must(t, err)
	must(t, ch.Bind(ctx, client.Binding{Source: "dlx", Destination: "dead"}))
	declare := func(name, dlx string) {
		_, err := ch.DeclareQueue(ctx, name, client.QueueOptions{Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String(dlx)}}})
		must(t, err)
	}
	declare("to-missing", "missing-exchange")
	declare("to-nowhere", "nobody-bound")
	declare("to-dlx", "dlx")
	reject := func(queue string, props *wire.Props) {
		t.Helper()
		must(t, ch.Publish(ctx, "", client.Message{RoutingKey: queue, Body: []byte("m"), Props: props}))
		cs, err := ch.Consume(ctx, queue, client.ConsumeOptions{Prefetch: 1})
		must(t, err)
		must(t, recv(t, cs).Reject())
		must(t, cs.Cancel(ctx))
	}
	reject("to-missing", nil)
	reject("to-nowhere", nil)
	reject("to-dlx", nil)
	// Properties that fill the 65,535-byte block leave no room for the
	// death history: the dead letter is dropped, not a broker panic.
	reject("to-dlx", &wire.Props{Headers: wire.Table{{Key: "big", Value: wire.String(strings.Repeat("x", 65_500))}}})

	applied(t, s, ch)
	if d, q := queueStats(s, "dead").Ready, queueStats(s, "to-dlx").Ready; d != 1 || q != 0 {
		t.Fatalf("ready: dead %d, to-dlx %d; want 1 and 0", d, q)
	}
	for _, c := range []struct {
		queue          string
		dlx, dropped   uint64
		reason, metric string
	}{
		{"to-missing", 0, 1, "no_exchange", ""},
		{"to-nowhere", 0, 1, "unroutable", ""},
		{"to-dlx", 1, 1, "too_large", ""},
	} {
		st := queueStats(s, c.queue)
		if st.DeadLettered != c.dlx || st.DeadLetterDropped != c.dropped {
			t.Errorf("%s: dead_lettered_total %d dead_letter_dropped_total %d, want %d and %d", c.queue, st.DeadLettered, st.DeadLetterDropped, c.dlx, c.dropped)
		}
		if v := metricValue(s, `warren_dead_letter_dropped_total{reason="`+c.reason+`"}`); v != 1 {
			t.Errorf("warren_dead_letter_dropped_total{reason=%q} = %v, want 1", c.reason, v)
		}
		if !strings.Contains(logs.String(), "queue="+c.queue) || !strings.Contains(logs.String(), "reason="+c.reason) {
			t.Errorf("no log line for the %s drop from %s:\n%s", c.reason, c.queue, logs.String())
		}
	}
	aliveCheck(t, s, ch)
}
