package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/wire"
)

// TestWarrendChild is warrend in a child process for the tests below
// (WARREND_TEST_CHILD set): the test binary re-runs itself with
// -test.run=TestWarrendChild, and the child prints its addresses once
// serving. Skipped otherwise.
func TestWarrendChild(t *testing.T) {
	if os.Getenv("WARREND_TEST_CHILD") == "" {
		t.Skip("the child process of TestDurableTopologySurvivesKill9")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	args := strings.Fields(os.Getenv("WARREND_TEST_CHILD"))
	err := run(ctx, args, func(string) string { return "" }, strings.NewReader(""), io.Discard, os.Stderr, func(b, h net.Addr) {
		fmt.Printf("READY %s %s\n", b, h)
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "warrend:", err)
		os.Exit(1)
	}
}

// startChild starts warrend as a child process on data dir and returns
// it and its native protocol address once it serves.
func startChild(t *testing.T, data string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWarrendChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "WARREND_TEST_CHILD=--listen 127.0.0.1:0 --http 127.0.0.1:0 --log-level warn --disk-free-limit -1 --data "+data)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "READY" {
				addr <- f[1]
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("warrend child exited before serving")
		}
		return cmd, a
	case <-time.After(30 * time.Second):
		t.Fatal("warrend child did not start")
	}
	return nil, ""
}

// TestDurableTopologySurvivesKill9: a durable exchange, queue and binding
// whose declares were answered survive a kill -9 of warrend; a
// non-durable queue declared with them does not.
func TestDurableTopologySurvivesKill9(t *testing.T) {
	if testing.Short() {
		t.Skip("starts warrend processes")
	}
	data := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd, addr := startChild(t, data)
	conn, err := client.Dial(ctx, "warren://guest:guest@"+addr)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := conn.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.DeclareExchange(ctx, "orders", "topic", client.ExchangeOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "kept", client.QueueOptions{Durable: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(ctx, "transient", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Bind(ctx, client.Binding{Source: "orders", Destination: "kept", RoutingKey: "eu.*"}); err != nil {
		t.Fatal(err)
	}
	// Answered: now kill -9.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	conn.Close()

	_, addr = startChild(t, data)
	conn, err = client.Dial(ctx, "warren://guest:guest@"+addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	passive := func(name string) error {
		ch, err := conn.Channel(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = ch.DeclareQueue(ctx, name, client.QueueOptions{Passive: true})
		return err
	}
	if err := passive("kept"); err != nil {
		t.Fatalf("durable queue after kill -9: %v", err)
	}
	var we *wire.Error
	if err := passive("transient"); !errors.As(err, &we) || we.Code != wire.NotFound {
		t.Fatalf("non-durable queue after kill -9: %v, want not_found", err)
	}
	ch, err = conn.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.DeclareExchange(ctx, "orders", "topic", client.ExchangeOptions{Passive: true}); err != nil {
		t.Fatalf("durable exchange after kill -9: %v", err)
	}
	// The binding: a message published to orders with eu.x reaches kept.
	// Persistent: its confirm means it is in the queue (a transient one to
	// a durable queue is confirmed when proposed, before it is counted).
	if err := ch.Publish(ctx, "orders", client.Message{RoutingKey: "eu.x", Body: []byte("m"), Persistent: true}); err != nil {
		t.Fatal(err)
	}
	q, err := ch.DeclareQueue(ctx, "kept", client.QueueOptions{Passive: true})
	if err != nil || q.Messages != 1 {
		t.Fatalf("kept after a publish through the recovered binding: %+v %v, want 1 message", q, err)
	}
}

// TestCorruptMetaLogRefusesToStart: damage inside the metadata log's
// synced bytes makes warrend refuse to start, with an error naming the
// damaged file (it never starts on a topology that silently lost part).
func TestCorruptMetaLogRefusesToStart(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	args := []string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--data", data, "--log-level", "error",
		"--disk-free-limit", "-1"} // not the host's free disk space
	go func() {
		done <- run(ctx, args, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard,
			func(b, _ net.Addr) { addrs <- b })
	}()
	var addr net.Addr
	select {
	case addr = <-addrs:
	case err := <-done:
		t.Fatal(err)
	}
	conn, err := client.Dial(context.Background(), "warren://guest:guest@"+addr.String())
	if err != nil {
		t.Fatal(err)
	}
	chn, err := conn.Channel(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := chn.DeclareQueue(context.Background(), fmt.Sprintf("q%d", i), client.QueueOptions{Durable: true}); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Flip a byte early in every log file (inside what was synced).
	var damaged []string
	_ = filepath.Walk(data, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() || fi.Size() < 256 {
			return nil
		}
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, 100); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x40
		if _, err := f.WriteAt(b, 100); err != nil {
			t.Fatal(err)
		}
		damaged = append(damaged, filepath.Base(p))
		return nil
	})
	if len(damaged) == 0 {
		t.Fatal("no log file found under the data directory")
	}
	err = run(context.Background(), args, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard,
		func(net.Addr, net.Addr) { t.Error("warrend started on a damaged metadata log") })
	if err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("start on a damaged log: %v, want a corruption error", err)
	}
	t.Logf("refused: %v", err)
	named := false
	for _, d := range damaged {
		named = named || strings.Contains(err.Error(), d)
	}
	if !named {
		t.Fatalf("the error %q names none of the damaged files %v", err, damaged)
	}
}

// TestReadyz: /readyz answers 503 while warrend recovers, 200 once it
// serves, and 503 again while it shuts down.
func TestReadyz(t *testing.T) {
	var state atomic.Int32
	srv := httptest.NewServer(readyzHandler(&state, nil))
	defer srv.Close()
	get := func() (int, string) {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get(); code != 503 || !strings.Contains(body, "recovering") {
		t.Fatalf("before recovery: %d %q, want 503 recovering", code, body)
	}
	state.Store(stateReady)
	if code, _ := get(); code != 200 {
		t.Fatalf("after recovery: %d, want 200", code)
	}
	state.Store(stateStopping)
	if code, body := get(); code != 503 || !strings.Contains(body, "shutting down") {
		t.Fatalf("shutting down: %d %q, want 503", code, body)
	}
}
