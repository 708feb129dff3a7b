package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHTTPBounds: max_http_connections and http_timeout_ms from the config
// file bound the HTTP listener (internal/httpbound has the mechanism's
// tests). An idle keep-alive connection is closed after http_timeout_ms
// (before, never); with a connection serving a request (its body awaited),
// a second one at max_http_connections 1 is refused with 503 naming the
// setting (before, admitted without end).
func TestHTTPBounds(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "warren.json")
	if err := os.WriteFile(cfg, []byte(`{"log_level":"warn","max_http_connections":1,"http_timeout_ms":300}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"WARREN_DATA": filepath.Join(dir, "data"), "WARREN_DISK_FREE_LIMIT": "-1"}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config", cfg},
			func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, &stderr,
			func(_, h net.Addr) { addrs <- h })
	}()
	defer func() {
		cancel()
		<-done
	}()
	var h string
	select {
	case a := <-addrs:
		h = a.String()
	case err := <-done:
		t.Fatalf("warrend exited: %v\n%s", err, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("warrend did not start")
	}
	dialH := func() (net.Conn, *bufio.Reader) {
		nc, err := net.Dial("tcp", h)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = nc.Close() })
		_ = nc.SetDeadline(time.Now().Add(10 * time.Second)) // a safety net
		return nc, bufio.NewReader(nc)
	}
	closed := func(br *bufio.Reader, what string) {
		t.Helper()
		_, err := br.ReadByte()
		var ne net.Error
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("%s: still open (%v), want it closed by warrend", what, err)
		}
	}

	nc, br := dialH()
	if _, err := io.WriteString(nc, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	_, _ = io.ReadAll(resp.Body)
	closed(br, "a keep-alive connection idle past http_timeout_ms 300")

	// A request whose body the handler waits for: 100 Continue says the
	// handler is reading it (the connection is serving a request).
	busy, bbr := dialH()
	if _, err := io.WriteString(busy, "PUT /api/vhosts/v HTTP/1.1\r\nHost: x\r\nAuthorization: Basic Z3Vlc3Q6Z3Vlc3Q=\r\n"+
		"Content-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: 100\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := bbr.ReadString('\n'); err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("want 100 Continue, got %q %v", line, err)
	}
	_, _ = bbr.ReadString('\n') // the blank line after it
	_, br2 := dialH()
	resp, err = http.ReadResponse(br2, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !strings.Contains(string(msg), "max_http_connections") {
		t.Fatalf("a second connection at max_http_connections 1: %s %q, want 503 naming it", resp.Status, msg)
	}
	// The body never comes: the request is cut after http_timeout_ms.
	resp, err = http.ReadResponse(bbr, nil)
	if err == nil {
		_, _ = io.ReadAll(resp.Body)
	}
	closed(bbr, "a request whose body never came, past http_timeout_ms")
}
