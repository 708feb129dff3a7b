package netio_test

import (
	"net"
	"strings"
	"testing"

	"github.com/warren-mq/warren/internal/syncbuf"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestMalformedLoginsAreLogged (item 14): an unsupported mechanism and a
// malformed PLAIN response are failed logins too, logged with their source
// and reason.
func TestMalformedLoginsAreLogged(t *testing.T) {
	var logs syncbuf.Buffer
	s := warrentest.StartServer(t, &netio.Config{Logger: logTo(&logs)})
	for _, auth := range []*wire.Auth{
		{Mechanism: "XX", MaxFrame: wire.MinMaxFrame},
		{Mechanism: "PLAIN", Response: []byte("no-nul-separators"), MaxFrame: wire.MinMaxFrame},
	} {
		nc, err := net.Dial("tcp", s.Addr().String())
		must(t, err)
		r := &rawConn{t: t, nc: nc}
		r.write(wire.Preamble[:])
		if _, ok := r.read().(*wire.Hello); !ok {
			t.Fatal("no HELLO")
		}
		r.write(wire.AppendFrame(nil, 0, auth))
		r.expectClose(wire.AuthFailed)
		nc.Close()
	}
	out := logs.String()
	for _, want := range []string{"reason=unsupported_mechanism", "reason=malformed_plain_response", "source=127.0.0.1"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

// TestAuthMetrics: refused logins through the operator API count in
// warren_auth_failures_total as the protocol's do, and the password-check
// limits are visible in /metrics.
func TestAuthMetrics(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	if _, ok := s.Authenticate("nobody", "x", "127.0.0.1:1"); ok {
		t.Fatal("unknown user accepted")
	}
	if v := metricValue(s, "warren_auth_failures_total"); v != 1 {
		t.Errorf("warren_auth_failures_total = %v after one refused admin login, want 1", v)
	}
	for _, name := range []string{"warren_auth_checks_running", "warren_auth_checks_max", "warren_auth_delayed_total"} {
		if v := metricValue(s, name); v < 0 {
			t.Errorf("%s missing from /metrics", name)
		}
	}
}
