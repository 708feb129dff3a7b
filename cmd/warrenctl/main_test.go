package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"golang.org/x/crypto/bcrypt"
	"net"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "warrenctl-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "warrenctl")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		panic("building warrenctl: " + err.Error() + "\n" + string(out))
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type ctl struct {
	t        *testing.T
	url, api string
}

// run runs warrenctl in process (its run function, as main calls it,
// with no WARREN_* environment) and returns stdout, stderr and the exit
// code. The README walk-through runs the built binary instead.
func (c *ctl) run(stdin string, args ...string) (string, string, int) {
	c.t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append([]string{"--url", c.url, "--api", c.api}, args...),
		func(string) string { return "" }, strings.NewReader(stdin), &out, &errb)
	return out.String(), errb.String(), code
}

func (c *ctl) ok(stdin string, args ...string) string {
	c.t.Helper()
	out, errs, code := c.run(stdin, args...)
	if code != 0 {
		if len(out) > 2000 {
			out = "…" + out[len(out)-2000:]
		}
		c.t.Fatalf("warrenctl %v: exit %d\n%s%s", args, code, out, errs)
	}
	return out
}

// newCtl starts a broker (cfg may be nil) with its admin API and returns a
// ctl that runs the built warrenctl against them.
func newCtl(t *testing.T, cfg *netio.Config) *ctl {
	t.Helper()
	srv := warrentest.StartServer(t, cfg)
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, 0)
	// Users made here are checked at bcrypt's least cost: a cost-10 check
	// under the race detector on a loaded machine takes seconds (CI:
	// TestWarrenctlUsers' logins failed this way).
	a.PasswordCost = bcrypt.MinCost
	hs := httptest.NewServer(a)
	t.Cleanup(func() { hs.Close(); a.Close() })
	return &ctl{t: t, url: warrentest.URL(srv), api: hs.URL}
}

// queueJSON returns `warrenctl --json queue show NAME` decoded.
func (c *ctl) queueJSON(name string) map[string]any {
	c.t.Helper()
	var q map[string]any
	if err := json.Unmarshal([]byte(c.ok("", "--json", "queue", "show", name)), &q); err != nil {
		c.t.Fatalf("queue show %s: %v", name, err)
	}
	return q
}

func TestWarrenctl(t *testing.T) {
	c := newCtl(t, nil)

	c.ok("", "exchange", "declare", "dlx", "--type", "fanout")
	c.ok("", "queue", "declare", "dlq")
	c.ok("", "queue", "declare", "orders", "--max-length", "100", "--dlx", "dlx", "--ttl", "600000")
	c.ok("", "binding", "add", "--exchange", "dlx", "--queue", "dlq")
	if _, errs, _ := c.run("a\nb\nc\n", "publish", "--exchange", "", "--routing-key", "orders", "--lines", "--content-type", "text/plain"); !strings.Contains(errs, "published 3") {
		t.Fatalf("publish: %s", errs)
	}
	if out := c.ok("", "queue", "list"); !strings.Contains(out, "orders") || !regexpLine(out, "orders", "3") {
		t.Fatalf("queue list:\n%s", out)
	}
	if out := c.ok("", "consume", "orders", "--count", "3", "--reject"); out != "a\nb\nc\n" {
		t.Fatalf("consume --reject printed %q", out)
	}
	if out := c.ok("", "dlq", "peek", "dlq", "--count", "5"); !strings.Contains(out, "rejected in orders ×1, first published to (default)") || !strings.Contains(out, `"a"`) {
		t.Fatalf("dlq peek:\n%s", out)
	}
	if out := c.ok("", "dlq", "replay", "dlq"); !regexpLine(out, "moved", "3") {
		t.Fatalf("dlq replay:\n%s", out)
	}
	if out := c.ok("", "consume", "orders", "--count", "3"); out != "a\nb\nc\n" {
		t.Fatalf("consume after replay printed %q", out)
	}
	var q map[string]any
	if err := json.Unmarshal([]byte(c.ok("", "--json", "queue", "show", "orders")), &q); err != nil || q["max_length"] != 100.0 {
		t.Fatalf("--json queue show: %v %v", q, err)
	}
	if out := c.ok("body from arg", "publish", "--routing-key", "orders", "hello"); out != "" {
		t.Fatalf("publish printed to stdout: %q", out)
	}
	if out := c.ok("", "purge", "orders"); strings.TrimSpace(out) != "1" {
		t.Fatalf("purge printed %q", out)
	}
	if out := c.ok("", "status"); !strings.Contains(out, "queues") {
		t.Fatalf("status:\n%s", out)
	}
	if out := c.ok("", "connection", "list"); !strings.Contains(out, "ID") {
		t.Fatalf("connection list:\n%s", out)
	}

	// Failures: clear messages and non-zero exit codes.
	if _, errs, code := c.run("", "queue", "show", "missing"); code != 1 || !strings.Contains(errs, "not_found") {
		t.Fatalf("missing queue: exit %d %q", code, errs)
	}
	if _, errs, code := c.run("", "queue", "declare"); code != 2 || !strings.Contains(errs, "exactly one name") {
		t.Fatalf("usage error: exit %d %q", code, errs)
	}
	if _, errs, code := c.run("", "queue", "declare", "x", "--max-priority", "lots"); code != 2 || !strings.Contains(errs, "integer") {
		t.Fatalf("bad flag value: exit %d %q", code, errs)
	}
	if _, errs, code := c.run("", "queue", "declare", "x", "--max-priority", "999"); code != 1 || !strings.Contains(errs, "invalid_argument") {
		t.Fatalf("out of range: exit %d %q", code, errs)
	}
	if _, errs, code := c.run("", "frobnicate"); code != 2 || !strings.Contains(errs, "unknown command") {
		t.Fatalf("unknown command: exit %d %q", code, errs)
	}
	if _, errs, code := c.run("x", "publish", "--routing-key", "nowhere", "--mandatory", "x"); code != 1 || !strings.Contains(errs, "reached no queue") {
		t.Fatalf("unroutable: exit %d %q", code, errs)
	}
}

// regexpLine reports whether some line contains all the words.
func regexpLine(out string, words ...string) bool {
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		all := true
		for _, w := range words {
			found := false
			for _, x := range f {
				if x == w {
					found = true
				}
			}
			all = all && found
		}
		if all {
			return true
		}
	}
	return false
}

// TestWarrenctlReplayIDs: dlq peek shows each message's id, and dlq replay
// --ids replays those messages alone, wherever they are in the queue.
func TestWarrenctlReplayIDs(t *testing.T) {
	c := newCtl(t, nil)
	c.ok("", "exchange", "declare", "dlx", "--type", "fanout")
	c.ok("", "queue", "declare", "dlq")
	c.ok("", "queue", "declare", "orders", "--dlx", "dlx")
	c.ok("", "binding", "add", "--exchange", "dlx", "--queue", "dlq")
	c.run("a\nb\nc\n", "publish", "--routing-key", "orders", "--lines")
	c.ok("", "consume", "orders", "--count", "3", "--reject")
	var peeked struct{ Messages []struct{ ID uint64 } }
	if err := json.Unmarshal([]byte(c.ok("", "--json", "dlq", "peek", "dlq")), &peeked); err != nil || len(peeked.Messages) != 3 {
		t.Fatalf("--json dlq peek: %+v %v", peeked, err)
	}
	b := fmt.Sprint(peeked.Messages[1].ID)
	if out := c.ok("", "dlq", "peek", "dlq"); !regexpLine(out, "ID") || !regexpLine(out, b, `"b"`) {
		t.Fatalf("dlq peek does not show the ids:\n%s", out)
	}
	if out := c.ok("", "dlq", "replay", "dlq", "--ids", b); !regexpLine(out, "moved", "1") {
		t.Fatalf("dlq replay --ids %s:\n%s", b, out)
	}
	if out := c.ok("", "consume", "orders", "--count", "1"); out != "b\n" {
		t.Fatalf("consume after replaying b printed %q", out)
	}
	// b again (replayed already) with a: a partial replay, exit 0; b
	// alone: nothing replayed, exit 1 saying so.
	a := fmt.Sprint(peeked.Messages[0].ID)
	if out := c.ok("", "dlq", "replay", "dlq", "--ids", a+","+b); !regexpLine(out, "moved", "1") || !regexpLine(out, "missing", "1") {
		t.Fatalf("dlq replay --ids %s,%s:\n%s", a, b, out)
	}
	if out, errs, code := c.run("", "dlq", "replay", "dlq", "--ids", b); code != 1 || !regexpLine(out, "missing", "1") || !strings.Contains(errs, "nothing replayed") {
		t.Fatalf("dlq replay --ids %s (none held): exit %d, %q %q", b, code, out, errs)
	}
	if _, errs, code := c.run("", "dlq", "replay", "dlq", "--ids", b+","+b); code != 1 || !strings.Contains(errs, "nothing replayed") {
		t.Fatalf("dlq replay --ids %s,%s (the broker counts it missing once): exit %d %q", b, b, code, errs)
	}
	if _, errs, code := c.run("", "dlq", "replay", "dlq", "--ids", "x"); code != 2 || !strings.Contains(errs, "--ids") {
		t.Fatalf("dlq replay --ids x: exit %d %q", code, errs)
	}
}

// The admin API's default address follows --url's port: 10,000 above it,
// so a cluster node's --url reaches that node's admin API.
func TestDefaultAPI(t *testing.T) {
	for _, c := range []struct {
		addr string
		tls  bool
		want string
	}{
		{"127.0.0.1:5680", false, "http://127.0.0.1:15680"},
		{"127.0.0.1:5690", false, "http://127.0.0.1:15690"},
		{"broker:5681", true, "https://broker:15681"},
		{"[::1]:5700", false, "http://[::1]:15700"},
		{"127.0.0.1:60000", false, "http://127.0.0.1:15680"},
		{"127.0.0.1:60000", true, "https://127.0.0.1:15681"},
	} {
		if got := defaultAPI(c.addr, c.tls); got != c.want {
			t.Errorf("defaultAPI(%q, %v) = %q, want %q", c.addr, c.tls, got, c.want)
		}
	}
}

// An admin API that does not answer at the address warrenctl derived from
// --url (a warrend started with another --http) is reported with what to
// do: before, the error named only the guessed address.
func TestDerivedAPIRefusedSaysHowToNameIt(t *testing.T) {
	var apiPort int
	for apiPort <= 10000 { // the admin port is the native one + 10000
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		apiPort = l.Addr().(*net.TCPAddr).Port
		l.Close() // closed: nothing answers there
	}
	url := fmt.Sprintf("warren://guest:guest@127.0.0.1:%d", apiPort-10000)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"--url", url, "queue", "list"},
		func(string) string { return "" }, strings.NewReader(""), &out, &errb)
	if code != 1 || !strings.Contains(errb.String(), fmt.Sprintf(":%d", apiPort)) || !strings.Contains(errb.String(), "--api http://HOST:PORT") {
		t.Fatalf("exit %d, stderr %q: want 1 and a hint to give --api", code, errb.String())
	}
	// Given with --api, the address is the user's own: no guess to explain.
	errb.Reset()
	code = run(context.Background(), []string{"--url", url, "--api", fmt.Sprintf("http://127.0.0.1:%d", apiPort), "queue", "list"},
		func(string) string { return "" }, strings.NewReader(""), &out, &errb)
	if code != 1 || strings.Contains(errb.String(), "--api http://HOST:PORT") {
		t.Fatalf("exit %d, stderr %q: want 1 without the hint", code, errb.String())
	}
}
