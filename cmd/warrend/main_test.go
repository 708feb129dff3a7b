package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

func TestWarrendServesAndShutsDown(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "warren.json")
	if err := os.WriteFile(cfg, []byte(`{"log_level":"warn","max_connections":50}`), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"WARREN_DATA": filepath.Join(dir, "data")}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, []string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--config", cfg},
			func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, &stderr,
			func(b, h net.Addr) { addrs <- [2]net.Addr{b, h} })
	}()
	var a [2]net.Addr
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("warrend exited: %v\n%s", err, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("warrend did not start")
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); err != nil {
		t.Fatalf("data directory from WARREN_DATA not created: %v", err)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + a[1].String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz %d", code)
	}
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz %d", code)
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer ccancel()
	c, err := client.Dial(cctx, "warren://guest:guest@"+a[0].String())
	if err != nil {
		t.Fatal(err)
	}
	ch, err := c.Channel(cctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.DeclareQueue(cctx, "orders", client.QueueOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := ch.Publish(cctx, "", client.Message{RoutingKey: "orders", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	_, body := get("/metrics")
	for _, want := range []string{"warren_connections 1", `warren_queue_ready{queue="orders"} 1`, "warren_published_total 1",
		"warren_publish_confirm_seconds_bucket", "go_memstats_alloc_bytes", "warren_eventloop_busy_ratio"} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	// The whole scrape, Go process metrics included, is what Prometheus reads.
	parser := expfmt.NewTextParser(model.LegacyValidation)
	if _, err := parser.TextToMetricFamilies(strings.NewReader(body)); err != nil {
		t.Errorf("Prometheus cannot parse /metrics: %v", err)
	}
	cancel() // SIGTERM
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("shutdown: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("warrend did not shut down")
	}
	// Durability is built (one node): no start-up warning that it is not.
	if strings.Contains(stderr.String(), "not yet honoured") {
		t.Errorf("a start-up warning that durable/persistent are not yet honoured:\n%s", stderr.String())
	}
	select {
	case <-c.Done():
		if wire.CodeOf(c.Err()) != wire.ConnectionForced {
			t.Fatalf("client saw %v, want connection_forced", c.Err())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("client not closed by the shutdown")
	}
}

func TestHashPassword(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"hash-password"}, func(string) string { return "" }, strings.NewReader("s3cret\n"), &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.String(), "$2") {
		t.Fatalf("not a bcrypt hash: %q", out.String())
	}
}

func TestBadConfigIsAClearError(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "bad.json")
	os.WriteFile(cfg, []byte(`{"listen_addr":"x"}`), 0o600)
	err := run(context.Background(), []string{"--config", cfg}, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "unknown field") {
		t.Fatalf("got %v", err)
	}
}

func TestHelpExitsZero(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), []string{"--help"}, func(string) string { return "" }, strings.NewReader(""), &out, io.Discard, nil)
	if err != nil || !strings.Contains(out.String(), "usage: warrend") || !strings.Contains(out.String(), "hash-password") {
		t.Fatalf("warrend --help: err %v, stdout %q", err, out.String())
	}
	err = run(context.Background(), []string{"--bogus"}, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard, nil)
	if exitCode(err) != 2 {
		t.Fatalf("warrend --bogus: %v, exit %d; want exit 2", err, exitCode(err))
	}
}

// Every config file in the README (a ```json block with a "listen" key)
// is one warrend accepts.
func TestReadmeConfigParses(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(string(b), "```json\n")[1:]
	if len(parts) == 0 {
		t.Fatal("README has no ```json config block")
	}
	configs := 0
	for _, p := range parts {
		block, _, _ := strings.Cut(p, "```")
		if !strings.Contains(block, `"listen"`) {
			continue
		}
		configs++
		dec := json.NewDecoder(strings.NewReader(block))
		dec.DisallowUnknownFields()
		var fc fileConfig
		if err := dec.Decode(&fc); err != nil {
			t.Errorf("README config block: %v\n%s", err, block)
		}
	}
	if configs == 0 {
		t.Fatal("README has no config file block")
	}
}

// Config errors give the file, line and column; a bad log level lists the
// valid ones.
func TestConfigErrorsSayWhere(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ body, want string }{
		{"{\n  \"listen\": \"127.0.0.1:5680\",\n  \"max_connections\": \"many\"\n}\n", "warren.json:3:"},
		{"{\n  \"listen\": \"127.0.0.1:5680\"\n  \"http\": \"x\"\n}\n", "warren.json:3:"},
		{"{\n  \"listen_addr\": \"x\"\n}\n", "warren.json:2:"},
	} {
		cfg := filepath.Join(dir, "warren.json")
		if err := os.WriteFile(cfg, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		err := run(context.Background(), []string{"--config", cfg}, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("config %q: %v; want %q", c.body, err, c.want)
		}
	}
	err := run(context.Background(), []string{"--log-level", "verbose"}, func(string) string { return "" }, strings.NewReader(""), io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), "debug, info, warn or error") {
		t.Errorf("unknown log level: %v", err)
	}
}

// startWarrend runs warrend with args until the test ends and returns the
// native protocol address.
func startWarrend(t *testing.T, args []string, env map[string]string) net.Addr {
	t.Helper()
	if env == nil {
		env = map[string]string{}
	}
	env["WARREN_DATA"] = filepath.Join(t.TempDir(), "data")
	if _, ok := env["WARREN_DISK_FREE_LIMIT"]; !ok {
		env["WARREN_DISK_FREE_LIMIT"] = "-1" // the tests must not depend on the host's free disk space
	}
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan net.Addr, 1)
	done := make(chan error, 1)
	var stderr bytes.Buffer
	go func() {
		done <- run(ctx, append([]string{"--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"}, args...),
			func(k string) string { return env[k] }, strings.NewReader(""), io.Discard, &stderr,
			func(b, _ net.Addr) { addrs <- b })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			t.Error("warrend did not shut down")
		}
	})
	select {
	case a := <-addrs:
		return a
	case err := <-done:
		done <- err // for the cleanup
		t.Fatalf("warrend exited: %v\n%s", err, stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("warrend did not start")
	}
	return nil
}

// Item 8: the handshake deadline is configurable from the command line.
func TestHandshakeTimeoutFlag(t *testing.T) {
	a := startWarrend(t, []string{"--handshake-timeout-ms", "200"}, nil)
	nc, err := net.Dial("tcp", a.String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.Write(wire.Preamble[:])
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second)) // a safety net, not the wait
	b, err := io.ReadAll(nc)
	if err != nil {
		t.Fatalf("not closed by the 200ms handshake deadline: %v", err)
	}
	var codes []wire.Code
	for len(b) > 0 {
		f, n, err := wire.Split(b, wire.HandshakeMaxFrame)
		if err != nil || n == 0 {
			t.Fatalf("bad frames from the broker: %v", err)
		}
		if body, err := wire.Decode(f, wire.HandshakeMaxFrame, nil); err == nil {
			if c, ok := body.(*wire.Close); ok {
				codes = append(codes, c.Code)
			}
		}
		b = b[n:]
	}
	if len(codes) != 1 || codes[0] != wire.ResourceLimit {
		t.Fatalf("CLOSE codes %v, want one resource_limit", codes)
	}
}

// A config file's user whose password_hash is not a bcrypt hash (the
// README's "$2a$10$..." placeholder pasted as it is) could never log in:
// with disable_guest nobody could. warrend refuses to start, naming the
// user and how to make a hash, and writes nothing to the data directory.
func TestConfigUserNeedsABcryptHash(t *testing.T) {
	dir := t.TempDir()
	h, err := netio.HashPassword("s3cret")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ users, want string }{
		{`[{"name": "app", "password_hash": "$2a$10$...", "tags": ["administrator"]}]`, `user "app": password_hash is not a bcrypt hash`},
		{`[{"name": "app"}]`, `user "app": password_hash is not a bcrypt hash`},
		{`[{"name": "", "password_hash": "` + h + `"}]`, `a user without a name`},
		{`[{"name": "app", "password_hash": "` + h + `"}, {"name": "app", "password_hash": "` + h + `"}]`, `user "app" is listed twice`},
	} {
		cfg := filepath.Join(dir, "warren.json")
		if err := os.WriteFile(cfg, []byte(`{"disable_guest": true, "users": `+c.users+`}`), 0o600); err != nil {
			t.Fatal(err)
		}
		data := filepath.Join(dir, "data")
		// A warrend that takes the config serves: stop it as soon as it is
		// ready, so the test fails rather than waits.
		ctx, cancel := context.WithCancel(context.Background())
		err := run(ctx, []string{"--config", cfg, "--data", data, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"},
			func(k string) string {
				if k == "WARREN_DISK_FREE_LIMIT" {
					return "-1"
				}
				return ""
			}, strings.NewReader(""), io.Discard, io.Discard, func(net.Addr, net.Addr) { cancel() })
		cancel()
		_, statErr := os.Stat(data)
		os.RemoveAll(data)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "warrend hash-password") {
			t.Errorf("users %s: %v; want an error saying %q and naming warrend hash-password", c.users, err, c.want)
		}
		if exitCode(err) != 1 {
			t.Errorf("users %s: exit %d, want 1", c.users, exitCode(err))
		}
		if !os.IsNotExist(statErr) {
			t.Errorf("users %s: the data directory was made (%v)", c.users, statErr)
		}
	}
}
