package netio_test

import (
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestOneFrameRoutesEachMessage: a PUBLISH frame's messages are routed
// each by its own key and headers, however they follow one another in the
// batch (the publish loop remembers the routes of the batch's last few keys
// for messages without headers; one with headers is routed afresh).
func TestOneFrameRoutesEachMessage(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "d", "direct", client.ExchangeOptions{}))
	must(t, ch.DeclareExchange(ctx, "h", "headers", client.ExchangeOptions{}))
	for _, q := range []string{"qa", "qb", "red"} {
		_, err := ch.DeclareQueue(ctx, q, client.QueueOptions{})
		must(t, err)
	}
	must(t, ch.Bind(ctx, client.Binding{Source: "d", Destination: "qa", RoutingKey: "a"}))
	must(t, ch.Bind(ctx, client.Binding{Source: "d", Destination: "qb", RoutingKey: "b"}))
	must(t, ch.Bind(ctx, client.Binding{Source: "h", Destination: "red", Args: wire.Table{
		{Key: "x-match", Value: wire.String("any")}, {Key: "color", Value: wire.String("red")}}}))

	red := wire.AppendProperties(nil, &wire.Properties{Present: 1 << wire.PropHeaders,
		Headers: wire.AppendTable(nil, wire.Table{{Key: "color", Value: wire.String("red")}})[4:]})[2:]
	type msg struct{ key, body string }
	frame := func(seq uint64, exchange string, ms []msg, props func(i int) []byte) []byte {
		dst, mark := wire.BeginPublish(nil, 1, seq, []byte(exchange))
		for i, m := range ms {
			dst = wire.AppendMessage(dst, &wire.Message{RoutingKey: []byte(m.key), Properties: props(i), Body: []byte(m.body)})
		}
		return mark.End(dst, uint32(len(ms)))
	}
	r := rawDial(t, s, 0)
	r.write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1}))
	direct := []msg{{"a", "1"}, {"a", "2"}, {"b", "3"}, {"a", "4"}, {"b", "5"}, {"b", "6"}, {"c", "7"}, {"a", "8"},
		{"e", "9"}, {"f", "10"}, {"g", "11"}, {"b", "12"}, {"a", "13"}} // more keys than are remembered
	r.write(frame(1, "d", direct, func(int) []byte { return nil }))
	// One key throughout; red headers on some: the ones without go nowhere.
	byHeaders := []msg{{"k", "red1"}, {"k", "plain1"}, {"k", "plain2"}, {"k", "red2"}, {"k", "plain3"}}
	r.write(frame(uint64(len(direct)+1), "h", byHeaders, func(i int) []byte {
		if byHeaders[i].body[0] == 'r' {
			return red
		}
		return nil
	}))
	for want := uint64(len(direct) + len(byHeaders)); ; {
		if c, ok := r.read().(*wire.Confirm); ok && c.Ranges[len(c.Ranges)-1].Last == want {
			break
		}
	}
	expectQueue(t, ch, "qa", "1", "2", "4", "8", "13")
	expectQueue(t, ch, "qb", "3", "5", "6", "12")
	expectQueue(t, ch, "red", "red1", "red2")
}
