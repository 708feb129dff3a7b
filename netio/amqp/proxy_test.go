package amqp_test

import (
	"errors"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio/amqp"
)

// dialVia connects through a fake proxy: header (a PROXY protocol header,
// or nothing) is written before the client's own bytes.
func dialVia(url, header string) (*amqp091.Connection, error) {
	return amqp091.DialConfig(url, amqp091.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.Dial(network, addr)
		if err == nil && header != "" {
			_, err = c.Write([]byte(header))
		}
		return c, err
	}})
}

// The PROXY protocol on the AMQP listener, as on the native one: a
// trusted proxy's header names the client, whose address is the one the
// broker judges (guest only from loopback, the per-source cap); a trusted
// peer may also connect directly; an untrusted peer's header is refused.
func TestProxyProtocol(t *testing.T) {
	t.Parallel() // its own broker
	loop := netip.MustParsePrefix("127.0.0.0/8")
	_, _, url := start(t, amqp.Config{ProxyTrusted: []netip.Prefix{loop}, MaxConnectionsPerSource: 1})

	// A header naming a remote client: guest is refused (loopback only).
	_, err := dialVia(url, "PROXY TCP4 203.0.113.7 127.0.0.1 40000 5672\r\n")
	var ae *amqp091.Error
	if !errors.As(err, &ae) || ae.Code != amqp091.AccessRefused {
		t.Fatalf("guest through a proxy from 203.0.113.7: %v, want 403 ACCESS_REFUSED", err)
	}
	// A header naming a loopback client (v1), and one without a header: both
	// guest, both admitted; each counts against its own source.
	c1, err := dialVia(url, "PROXY TCP4 127.0.0.9 127.0.0.1 40001 5672\r\n")
	if err != nil {
		t.Fatal("guest through a proxy from 127.0.0.9:", err)
	}
	defer c1.Close()
	c2, err := dialVia(url, "")
	if err != nil {
		t.Fatal("a trusted peer without a header:", err)
	}
	defer c2.Close()
	// A second from 127.0.0.9 (v2 this time) is over the per-source cap.
	v2 := "\r\n\r\n\x00\r\nQUIT\n\x21\x11\x00\x0c" + string([]byte{127, 0, 0, 9, 127, 0, 0, 1, 0x9c, 0x42, 0x16, 0x28})
	_, err = dialVia(url, v2)
	if !errors.As(err, &ae) || ae.Code != amqp091.ResourceError || !strings.Contains(ae.Reason, "127.0.0.9") {
		t.Fatalf("a second connection from 127.0.0.9: %v, want 506 naming the source", err)
	}
}

func TestProxyHeaderFromUntrustedPeer(t *testing.T) {
	t.Parallel() // its own broker
	_, _, url := start(t, amqp.Config{})
	if c, err := dialVia(url, "PROXY TCP4 127.0.0.9 127.0.0.1 40001 5672\r\n"); err == nil {
		c.Close()
		t.Fatal("a PROXY header from a peer not trusted was accepted")
	}
	if c, err := dialVia(url, ""); err != nil {
		t.Fatal(err)
	} else {
		c.Close()
	}
}

// AMQP connections are served by the event loops: 40 open connections
// cost the broker no goroutine each (a reader and a writer each before).
func TestConnectionsOnEventLoops(t *testing.T) {
	_, l, url := start(t, amqp.Config{})
	c, err := amqp091.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	base := runtime.NumGoroutine()
	for i := 0; i < 40; i++ {
		c, err := amqp091.Dial(url)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if n := l.ConnectionCount(); n != 41 {
		t.Fatalf("%d connections, want 41", n)
	}
	// amqp091-go runs 2 goroutines per connection of its own (reader,
	// heartbeater); the broker adds none per connection.
	if grown := runtime.NumGoroutine() - base; grown > 40*2+10 {
		t.Fatalf("%d goroutines more for 40 connections: the broker runs goroutines per connection", grown)
	}
}
