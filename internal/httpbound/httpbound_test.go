package httpbound

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// safety is how long a test waits for what must happen well before it: a
// net, not the synchronisation.
const safety = 10 * time.Second

// serve starts an HTTP server bounded by lim with h, on loopback.
func serve(t *testing.T, lim Limits, h http.Handler) (*Bound, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := New(lim)
	hs := b.Server(&http.Server{Handler: h})
	go func() { _ = hs.Serve(b.Listener(ln)) }()
	t.Cleanup(func() { _ = hs.Close() })
	return b, ln.Addr().String()
}

func dialRaw(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(safety))
	return nc, bufio.NewReader(nc)
}

func send(t *testing.T, nc net.Conn, s string) {
	t.Helper()
	if _, err := io.WriteString(nc, s); err != nil {
		t.Fatal(err)
	}
}

// get sends a keep-alive GET and reads its response.
func get(t *testing.T, nc net.Conn, br *bufio.Reader, path string) *http.Response {
	t.Helper()
	send(t, nc, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp
}

// closedByServer: the server closes nc (EOF or a reset) before the safety
// net's deadline.
func closedByServer(t *testing.T, br *bufio.Reader, what string) {
	t.Helper()
	_, err := br.ReadByte()
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("%s: still open (%v), want it closed by the server", what, err)
	}
}

// waitIdle waits until at least n connections have no request in progress
// (net/http marks one idle after its response is written, so a client can
// have its answer a moment before).
func waitIdle(t *testing.T, b *Bound, n int) {
	t.Helper()
	deadline := time.Now().Add(safety)
	for {
		b.mu.Lock()
		k := 0
		for c := b.head; c != nil; c = c.next {
			k++
		}
		b.mu.Unlock()
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d connections idle, want %d", k, n)
		}
		time.Sleep(time.Millisecond) // polling a state, with a deadline
	}
}

// testHandler: /ok answers, /body reads the whole body (started tells it
// began, done what the read returned).
func testHandler(started chan<- struct{}, done chan<- error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/body":
			started <- struct{}{}
			_, err := io.ReadAll(r.Body)
			done <- err
			if err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, "ok\n")
	})
}

// At the cap the oldest connection with no request in progress is closed
// to admit a new one; only when every connection is serving a request is
// the newcomer refused, with a 503 naming the limit. Before, warrend's HTTP
// listener took connections without end, and one idle between requests
// was kept for ever (no IdleTimeout): a client could hold every file
// descriptor the process has, the native and AMQP listeners' too.
func TestConnectionCap(t *testing.T) {
	started, done := make(chan struct{}, 4), make(chan error, 4)
	b, addr := serve(t, Limits{MaxConns: 2, Timeout: safety}, testHandler(started, done))
	c1, r1 := dialRaw(t, addr)
	if resp := get(t, c1, r1, "/ok"); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	c2, r2 := dialRaw(t, addr)
	if resp := get(t, c2, r2, "/ok"); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	// Both idle: a third is admitted, the oldest idle one closed.
	waitIdle(t, b, 2)
	c3, r3 := dialRaw(t, addr)
	if resp := get(t, c3, r3, "/ok"); resp.StatusCode != 200 {
		t.Fatalf("a third connection at the cap of 2, both idle: %s", resp.Status)
	}
	closedByServer(t, r1, "the oldest idle connection at the cap")
	// Both left serving a request (a body not sent yet): a fourth is refused.
	for _, nc := range []net.Conn{c2, c3} {
		send(t, nc, "POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nab")
		<-started
	}
	c4, r4 := dialRaw(t, addr)
	resp, err := http.ReadResponse(r4, nil)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 503 || !strings.Contains(string(msg), "max_http_connections") {
		t.Fatalf("a connection past the cap, every one busy: %s %q, want 503 naming max_http_connections", resp.Status, msg)
	}
	_ = c4
	if open, evicted, refused := b.Counts(); open != 2 || evicted != 1 || refused != 1 {
		t.Fatalf("open %d, evicted %d, refused %d; want 2, 1, 1", open, evicted, refused)
	}
	// Their bodies sent, both answer, and a newcomer is admitted again.
	for _, nc := range []net.Conn{c2, c3} {
		send(t, nc, "cdefghij")
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	waitIdle(t, b, 1)
	c5, r5 := dialRaw(t, addr)
	if resp := get(t, c5, r5, "/ok"); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
}

// A connection idle between requests is closed after the timeout; one that
// never sends a request line after ReadHeaderTimeout (net/http's).
func TestIdleClosed(t *testing.T) {
	_, addr := serve(t, Limits{Timeout: 200 * time.Millisecond}, testHandler(nil, nil))
	nc, br := dialRaw(t, addr)
	if resp := get(t, nc, br, "/ok"); resp.StatusCode != 200 {
		t.Fatal(resp.Status)
	}
	start := time.Now()
	closedByServer(t, br, "a connection idle past the timeout")
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v, want about the 200 ms timeout", d)
	}
}

// A request body that does not arrive within the timeout fails its read
// (the handler answers, the connection goes); before, a client dripping
// its body held the connection and its goroutine for ever.
func TestSlowBodyCut(t *testing.T) {
	started, done := make(chan struct{}, 1), make(chan error, 1)
	_, addr := serve(t, Limits{Timeout: 200 * time.Millisecond}, testHandler(started, done))
	nc, br := dialRaw(t, addr)
	send(t, nc, "POST /body HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nab")
	<-started
	select {
	case err := <-done:
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("the body's read: %v, want a timeout", err)
		}
	case <-time.After(safety):
		t.Fatal("a body that never arrives is still being read")
	}
	if resp, err := http.ReadResponse(br, nil); err == nil { // what the handler answered (nothing: 200)
		_, _ = io.ReadAll(resp.Body)
	}
	closedByServer(t, br, "the connection of a body cut short")
}

// A response the client does not read fails its write within the timeout
// of its first byte, so the handler lets go of it; a handler that waits
// longer than the timeout before it answers is not cut, nor is its
// request's context cancelled, with or without a body.
func TestSlowReaderCut(t *testing.T) {
	const d = 200 * time.Millisecond
	wrote := make(chan error, 1)
	_, addr := serve(t, Limits{Timeout: d}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			chunk := make([]byte, 1<<20)
			for i := 0; i < 1024; i++ { // 1 GiB: more than any socket buffers
				if _, err := w.Write(chunk); err != nil {
					wrote <- err
					return
				}
			}
			wrote <- nil
		case "/late":
			_, _ = io.ReadAll(r.Body)
			select {
			case <-time.After(3 * d): // a handler slower than the timeout (the thing tested, not a wait for it)
			case <-r.Context().Done():
				http.Error(w, "context cancelled", 500)
				return
			}
			_, _ = io.WriteString(w, "late\n")
		}
	}))
	nc, _ := dialRaw(t, addr)
	send(t, nc, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n") // and never read
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("1 GiB written to a client that reads nothing")
		}
	case <-time.After(safety):
		t.Fatal("the handler is still writing to a client that reads nothing")
	}
	for _, req := range []string{"GET /late HTTP/1.1\r\nHost: x\r\n\r\n", "POST /late HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab"} {
		nc, br := dialRaw(t, addr)
		send(t, nc, req)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(body) != "late\n" {
			t.Fatalf("%q, answered after three timeouts: %s %q, want 200 late", req, resp.Status, body)
		}
	}
}

// A request whose headers pass 64 KiB is refused with 431.
func TestHeaderBound(t *testing.T) {
	_, addr := serve(t, Limits{}, testHandler(nil, nil))
	nc, br := dialRaw(t, addr)
	send(t, nc, "GET /ok HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 100<<10)+"\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 431 {
		t.Fatalf("100 KiB of headers: %s, want 431", resp.Status)
	}
}
