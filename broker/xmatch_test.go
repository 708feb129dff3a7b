package broker

import (
	"errors"
	"strings"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestHeadersBindingXMatchValidated: a headers binding's x-match is "all" or
// "any"; anything else (a misspelling, RabbitMQ's "any-with-x", a non-string)
// is refused with invalid_argument naming the argument, instead of silently
// meaning "all".
func TestHeadersBindingXMatchValidated(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	if err := b.DeclareExchange(wire.ExchangeDeclare{Name: "h", Kind: wire.ExchangeHeaders}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.DeclareQueue(wire.QueueDeclare{Name: "q"}); err != nil {
		t.Fatal(err)
	}
	bind := func(v wire.Value) error {
		return b.Bind(wire.Bind{Source: "h", Destination: "q", Args: wire.Table{{Key: "x-match", Value: v}, {Key: "color", Value: wire.String("red")}}})
	}
	for _, ok := range []string{"all", "any"} {
		if err := bind(wire.String(ok)); err != nil {
			t.Errorf("x-match %q: %v", ok, err)
		}
	}
	for _, bad := range []wire.Value{wire.String("anyy"), wire.String("any-with-x"), wire.String(""), wire.Int(1)} {
		err := bind(bad)
		var we *wire.Error
		if !errors.As(err, &we) || we.Code != wire.InvalidArgument || !strings.Contains(we.Reason, "x-match") {
			t.Errorf("x-match %v: got %v, want invalid_argument naming x-match", bad, err)
		}
	}
	// A direct exchange ignores binding arguments, as RabbitMQ does.
	if err := b.Bind(wire.Bind{Source: "amq.direct", Destination: "q", RoutingKey: "k", Args: wire.Table{{Key: "x-match", Value: wire.String("anyy")}}}); err != nil {
		t.Errorf("x-match on a direct exchange: %v", err)
	}
}

// TestExchangeArgGivenTwice: an exchange argument given twice is refused,
// as queue and SUBSCRIBE arguments are, and the exchange is not made.
func TestExchangeArgGivenTwice(t *testing.T) {
	b := startBroker(t, Config{Shards: 1})
	hh := wire.Field{Key: "hash-header", Value: wire.String("h")}
	err := b.DeclareExchange(wire.ExchangeDeclare{Name: "ch", Kind: wire.ExchangeConsistentHash, Args: wire.Table{hh, hh}})
	var we *wire.Error
	if !errors.As(err, &we) || we.Code != wire.InvalidArgument || !strings.Contains(we.Reason, `"hash-header" given twice`) {
		t.Fatalf("declare with hash-header twice: %v, want invalid_argument naming the key", err)
	}
	if err := b.DeclareExchange(wire.ExchangeDeclare{Name: "ch", Kind: wire.ExchangeConsistentHash, Args: wire.Table{hh}}); err != nil {
		t.Fatalf("the refused declare left something behind: %v", err)
	}
}
