package netio_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// Regression tests for issue 11 item 1: table values decoded from a frame
// aliased the connection's read buffer, so what the broker stored (binding
// arguments, queue arguments) turned into the bytes of later frames.

// TestHeadersExchangeOverProtocol binds with x-match all and any and routes
// messages whose headers match, half-match and do not match, each on its own
// frame after the bindings. A message that routes nowhere is mandatory and
// comes back in a RETURN, which arrives before its confirm, so which
// messages were routed is known as soon as Publish returns.
func TestHeadersExchangeOverProtocol(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	must(t, ch.DeclareExchange(ctx, "by-attr", "headers", client.ExchangeOptions{}))
	for _, q := range []string{"all-q", "any-q"} {
		_, err := ch.DeclareQueue(ctx, q, client.QueueOptions{})
		must(t, err)
	}
	must(t, ch.Bind(ctx, client.Binding{Source: "by-attr", Destination: "all-q", Args: wire.Table{
		{Key: "x-match", Value: wire.String("all")}, {Key: "color", Value: wire.String("red")}, {Key: "size", Value: wire.Int(3)}}}))
	must(t, ch.Bind(ctx, client.Binding{Source: "by-attr", Destination: "any-q", Args: wire.Table{
		{Key: "x-match", Value: wire.String("any")}, {Key: "color", Value: wire.String("red")}, {Key: "size", Value: wire.Int(3)}}}))

	var returned []string
	ch.NotifyReturn(func(r client.Return) { returned = append(returned, string(r.Message.Body)) })
	cases := []struct {
		body    string
		headers wire.Table
	}{
		{"red-3", wire.Table{{Key: "color", Value: wire.String("red")}, {Key: "size", Value: wire.Int(3)}}},
		{"3-red-extra", wire.Table{{Key: "size", Value: wire.Int(3)}, {Key: "shape", Value: wire.String("round")}, {Key: "color", Value: wire.String("red")}}},
		{"red-only", wire.Table{{Key: "color", Value: wire.String("red")}}},
		{"blue-3", wire.Table{{Key: "color", Value: wire.String("blue")}, {Key: "size", Value: wire.Int(3)}}},
		{"blue-4", wire.Table{{Key: "color", Value: wire.String("blue")}, {Key: "size", Value: wire.Int(4)}}},
		{"red-as-bytes", wire.Table{{Key: "color", Value: wire.Bytes([]byte("red"))}}},
		{"no-headers", nil},
	}
	for _, c := range cases {
		var props *wire.Props
		if c.headers != nil {
			props = &wire.Props{Headers: c.headers}
		}
		must(t, ch.Publish(ctx, "by-attr", client.Message{RoutingKey: "ignored", Mandatory: true, Body: []byte(c.body), Props: props}))
	}
	if got, want := fmt.Sprint(returned), "[blue-4 red-as-bytes no-headers]"; got != want {
		t.Errorf("returned (routed nowhere): %s, want %s", got, want)
	}
	expectQueue(t, ch, "all-q", "red-3", "3-red-extra")
	expectQueue(t, ch, "any-q", "red-3", "3-red-extra", "red-only", "blue-3")
}

// expectQueue consumes name and checks it holds exactly want, in order: a
// marker published last through the default exchange must come right after.
func expectQueue(t *testing.T, ch *client.Channel, name string, want ...string) {
	t.Helper()
	ctx := ctxT(t)
	must(t, ch.Publish(ctx, "", client.Message{RoutingKey: name, Body: []byte("end-marker")}))
	cs, err := ch.Consume(ctx, name, client.ConsumeOptions{Prefetch: 100})
	must(t, err)
	var got []string
	for {
		d := recv(t, cs)
		must(t, d.Ack())
		if string(d.Body) == "end-marker" {
			break
		}
		got = append(got, string(d.Body))
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("queue %s got %v, want %v", name, got, want)
	}
}

// TestRedeclareWithOtherStringArgumentRefused: a queue re-declared with a
// different dead-letter-exchange (and an exchange with a different
// hash-header) is precondition_failed; the same settings are accepted.
func TestRedeclareWithOtherStringArgumentRefused(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx := ctxT(t)
	ch := channel(t, dial(t, s))
	dlx := func(name string) client.QueueOptions {
		return client.QueueOptions{Args: wire.Table{{Key: "dead-letter-exchange", Value: wire.String(name)}}}
	}
	_, err := ch.DeclareQueue(ctx, "orders", dlx("dlx-a"))
	must(t, err)
	_, err = ch.DeclareQueue(ctx, "orders", dlx("dlx-b"))
	expectCode(t, "queue redeclared with dead-letter-exchange dlx-b", err, wire.PreconditionFailed)
	_, err = ch.DeclareQueue(ctx, "orders", dlx("dlx-a"))
	must(t, err)

	hash := func(h string) client.ExchangeOptions {
		return client.ExchangeOptions{Args: wire.Table{{Key: "hash-header", Value: wire.String(h)}}}
	}
	must(t, ch.DeclareExchange(ctx, "shards", "consistent-hash", hash("user")))
	expectCode(t, "exchange redeclared with hash-header tenant", ch.DeclareExchange(ctx, "shards", "consistent-hash", hash("tenant")), wire.PreconditionFailed)
	must(t, ch.DeclareExchange(ctx, "shards", "consistent-hash", hash("user")))
}

func expectCode(t *testing.T, what string, err error, code wire.Code) {
	t.Helper()
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != code {
		t.Errorf("%s: got %v, want %v", what, err, code)
	}
}
