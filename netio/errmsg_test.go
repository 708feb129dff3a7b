package netio_test

import (
	"net"
	"strings"
	"testing"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// Error replies carry the reason once: "wire: not_found: no queue …", not
// "wire: not_found: wire: not_found: …".
func TestErrorReasonIsNotWrappedTwice(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ch := channel(t, dial(t, s))
	_, err := ch.DeclareQueue(ctxT(t), "nope", client.QueueOptions{Passive: true})
	if err == nil || err.Error() != `wire: not_found: no queue "nope"` {
		t.Fatalf("passive declare of a missing queue: %v", err)
	}
	must(t, ch.DeclareExchange(ctxT(t), "ev", "topic", client.ExchangeOptions{}))
	err = ch.DeclareExchange(ctxT(t), "ev", "direct", client.ExchangeOptions{})
	if wire.CodeOf(err) != wire.PreconditionFailed || strings.Count(err.Error(), "precondition_failed") != 1 {
		t.Fatalf("redeclare with another type: %v", err)
	}
}

// A redeclare with other settings names the setting and both values.
func TestRedeclareNamesTheSetting(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ch := channel(t, dial(t, s))
	ctx := ctxT(t)
	must(t, ch.DeclareExchange(ctx, "ev", "topic", client.ExchangeOptions{}))
	for _, c := range []struct {
		kind string
		o    client.ExchangeOptions
		want []string
	}{
		{"direct", client.ExchangeOptions{}, []string{`"ev"`, "type", "topic", "direct"}},
		{"topic", client.ExchangeOptions{AlternateExchange: "alt"}, []string{"alternate", `"alt"`}},
		{"topic", client.ExchangeOptions{Internal: true}, []string{"internal", "false", "true"}},
	} {
		if err := ch.DeclareExchange(ctx, "ev", c.kind, c.o); !mentions(err, wire.PreconditionFailed, c.want) {
			t.Errorf("exchange redeclare as %s: %v; want it to mention %q", c.kind, err, c.want)
		}
	}
	_, err := ch.DeclareQueue(ctx, "q", client.QueueOptions{Args: wire.Table{{Key: "max-length", Value: wire.Int(10)}}})
	must(t, err)
	for _, c := range []struct {
		o    client.QueueOptions
		want []string
	}{
		{client.QueueOptions{Args: wire.Table{{Key: "max-length", Value: wire.Int(20)}}}, []string{`"q"`, "max-length", "10", "20"}},
		{client.QueueOptions{}, []string{"max-length", "10", "absent"}},
		{client.QueueOptions{Args: wire.Table{{Key: "max-length", Value: wire.Int(10)}}, AutoDelete: true}, []string{"auto_delete", "false", "true"}},
		{client.QueueOptions{Args: wire.Table{{Key: "max-length", Value: wire.Int(10)}, {Key: "message-ttl", Value: wire.Int(5)}}}, []string{"message-ttl", "absent", "5"}},
	} {
		if _, err := ch.DeclareQueue(ctx, "q", c.o); !mentions(err, wire.PreconditionFailed, c.want) {
			t.Errorf("queue redeclare: %v; want it to mention %q", err, c.want)
		}
	}
}

// A publish to a missing exchange is nacked with an error that names the
// exchange and says to declare it.
func TestNackNamesTheMissingExchange(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ch := channel(t, dial(t, s))
	err := ch.Publish(ctxT(t), "events", client.Message{RoutingKey: "k", Body: []byte("x")})
	if wire.CodeOf(err) != wire.ExchangeNotFound || !strings.Contains(err.Error(), `exchange "events"`) || !strings.Contains(err.Error(), "declare") {
		t.Fatalf("Publish to a missing exchange: %v", err)
	}
	err = ch.PublishBatch(ctxT(t), "events", []client.Message{{RoutingKey: "k", Body: []byte("x")}})
	if wire.CodeOf(err) != wire.ExchangeNotFound || !strings.Contains(err.Error(), `exchange "events"`) || strings.Contains(err.Error(), "nack: exchange_not_found") {
		t.Fatalf("PublishBatch to a missing exchange: %v", err)
	}
}

func mentions(err error, code wire.Code, words []string) bool {
	if wire.CodeOf(err) != code {
		return false
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			return false
		}
	}
	return true
}

// guest/guest from a remote address is refused with the reason: guest is
// loopback-only. (Needs a non-loopback address on this host.)
func TestGuestFromRemoteSaysLoopbackOnly(t *testing.T) {
	var remote net.IP
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			remote = n.IP
			break
		}
	}
	if remote == nil {
		t.Skip("no non-loopback IPv4 address on this host")
	}
	s := warrentest.StartServer(t, &netio.Config{Addr: net.JoinHostPort(remote.String(), "0")})
	_, err := client.Dial(ctxT(t), warrentest.URL(s))
	if wire.CodeOf(err) != wire.AuthFailed || !strings.Contains(err.Error(), "loopback addresses only") {
		t.Fatalf("guest from %s: %v", remote, err)
	}
}
