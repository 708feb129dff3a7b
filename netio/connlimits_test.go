package netio_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// rawOpen connects without sending anything.
func rawOpen(t *testing.T, addr string) *rawConn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return &rawConn{t: t, nc: nc}
}

// hello sends the preamble and reads HELLO.
func (r *rawConn) hello() {
	r.t.Helper()
	r.write(wire.Preamble[:])
	if b, ok := r.read().(*wire.Hello); !ok {
		r.t.Fatalf("got %T, want HELLO", b)
	}
}

func guestAuth() []byte {
	return wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame})
}

// expectCloseWith reads up to a CLOSE and checks its code and reason.
func (r *rawConn) expectCloseWith(code wire.Code, reason string) {
	r.t.Helper()
	b := r.read()
	c, ok := b.(*wire.Close)
	if !ok {
		r.t.Fatalf("got %T, want CLOSE %v", b, code)
	}
	if c.Code != code || !strings.Contains(c.Reason, reason) {
		r.t.Fatalf("CLOSE %v %q, want %v with %q", c.Code, c.Reason, code, reason)
	}
	if r.read() != nil {
		r.t.Fatal("socket still open after CLOSE")
	}
}

// Item 7: a broker stopped gracefully with clients connected can be started
// again on the same port at once (SO_REUSEADDR: the closed connections sit
// in TIME_WAIT on the broker's port).
func TestRestartOnSamePortWithClientsConnected(t *testing.T) {
	s, err := netio.Start(netio.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	addr := s.Addr().String()
	ctx := ctxT(t)
	var conns []*client.Conn
	for i := 0; i < 3; i++ {
		c, err := client.Dial(ctx, "warren://guest:guest@"+addr)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := channel(t, c).DeclareQueue(ctx, "q", client.QueueOptions{}); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	if err := s.Close(ctx); err != nil { // what SIGTERM does
		t.Fatal(err)
	}
	for _, c := range conns {
		select {
		case <-c.Done():
		case <-ctx.Done():
			t.Fatal("client not closed by the shutdown")
		}
	}
	s2, err := netio.Start(netio.Config{Addr: addr})
	if err != nil {
		t.Fatalf("restart at once on the same port: %v", err)
	}
	defer s2.Close(context.Background())
	c, err := client.Dial(ctx, "warren://guest:guest@"+addr)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

// Item 28: an unspecified listen address ("[::]" or "0.0.0.0") is
// dual-stack, as Go's net.Listen (and so warrend's HTTP port) makes it.
func TestListenUnspecifiedIsDualStack(t *testing.T) {
	for _, addr := range []string{"[::]:0", "0.0.0.0:0"} {
		s := warrentest.StartServer(t, &netio.Config{Addr: addr})
		port := strconv.Itoa(s.Addr().(*net.TCPAddr).Port)
		for _, host := range []string{"127.0.0.1", "::1"} {
			nc, err := net.DialTimeout("tcp", net.JoinHostPort(host, port), 10*time.Second)
			if err != nil {
				t.Fatalf("listening on %s: dial %s: %v", addr, host, err)
			}
			r := &rawConn{t: t, nc: nc}
			r.hello()
			nc.Close()
		}
	}
}
