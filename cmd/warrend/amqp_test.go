package main

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// The AMQP listener gets the same connection bounds as the native one:
// handshake_timeout_ms and max_connections_per_source from the config.
func TestAMQPConnectionBoundsFromConfig(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "warren.json")
	if err := os.WriteFile(cfg, []byte(`{"max_connections_per_source": 1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	startWarrend(t, []string{"--config", cfg, "--amqp-listen", addr, "--handshake-timeout-ms", "200"}, nil)
	url := "amqp://guest:guest@" + addr + "/"
	// handshake_timeout_ms: a connection that stops after the header is
	// told so after 200 ms.
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second)) // a safety net, not the wait
	nc.Write([]byte("AMQP\x00\x00\x09\x01"))
	b, _ := io.ReadAll(nc)
	nc.Close()
	// connection.start, then connection.close 506 naming the deadline.
	if !strings.Contains(string(b), "handshake not completed within 200ms") || !closeCode(b, 506) {
		t.Fatalf("after the header and nothing more: %q, want connection.close 506 after 200ms", b)
	}
	// max_connections_per_source 1: the one above may still be counted
	// for a moment after its socket closed, so the first dial may retry.
	var c *amqp091.Connection
	for try := 0; ; try++ {
		if c, err = amqp091.Dial(url); err == nil {
			break
		}
		if try == 50 {
			t.Fatal(err)
		}
	}
	defer c.Close()
	_, err = amqp091.Dial(url)
	var ae *amqp091.Error
	if !errors.As(err, &ae) || ae.Code != 506 || !strings.Contains(ae.Reason, "max_connections_per_source") {
		t.Fatalf("second AMQP connection from 127.0.0.1 with max_connections_per_source 1: %v, want 506", err)
	}
}

// closeCode reports whether frames b hold a connection.close with code.
func closeCode(b []byte, code uint16) bool {
	for len(b) >= 8 {
		n := int(binary.BigEndian.Uint32(b[3:]))
		if len(b) < 8+n {
			return false
		}
		p := b[7 : 7+n]
		if b[0] == 1 && n >= 6 && binary.BigEndian.Uint16(p) == 10 && binary.BigEndian.Uint16(p[2:]) == 50 {
			return binary.BigEndian.Uint16(p[4:]) == code
		}
		b = b[8+n:]
	}
	return false
}

// warrend's /metrics has the AMQP front's metrics beside the native ones.
func TestAMQPMetricsOnMetricsEndpoint(t *testing.T) {
	addr := freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	httpAddr := make(chan net.Addr, 1)
	done := make(chan error, 1)
	env := map[string]string{"WARREN_DATA": filepath.Join(t.TempDir(), "data"), "WARREN_DISK_FREE_LIMIT": "-1"}
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--amqp-listen", addr},
			func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, io.Discard,
			func(_, h net.Addr) { httpAddr <- h })
	}()
	defer func() {
		cancel()
		<-done
	}()
	var h net.Addr
	select {
	case h = <-httpAddr:
	case err := <-done:
		t.Fatalf("warrend exited: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("warrend did not start")
	}
	c, err := amqp091.Dial("amqp://guest:guest@" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	resp, err := http.Get("http://" + h.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "\nwarren_amqp_connections 1\n") || !strings.Contains(string(body), "\nwarren_published_total ") {
		t.Fatalf("/metrics lacks warren_amqp_connections 1 beside the native metrics:\n%s", body)
	}
}
