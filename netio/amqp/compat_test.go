package amqp_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio/amqp"
)

// pikaPython is the Python with pika (python3-pika), or "" if there is
// none; WARREN_REQUIRE_PIKA=1 (CI, which installs it) makes its absence a
// failure instead of a skip.
func pikaPython(t *testing.T) string {
	py := os.Getenv("PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if err := exec.Command(py, "-c", "import pika").Run(); err != nil {
		if os.Getenv("WARREN_REQUIRE_PIKA") == "1" {
			t.Fatalf("%s cannot import pika (%v): apt-get install python3-pika", py, err)
		}
		t.Skipf("%s cannot import pika (%v): apt-get install python3-pika to run it", py, err)
	}
	return py
}

// The short version of make amqp-compat: a real third-party client, pika,
// through declare, bind, publish with confirms, mandatory returns,
// consume, ack, nack, reject, get, dead-lettering, priorities, recover,
// global prefetch, refusals and transactions (compat/pika_compat.py).
func TestPikaCompat(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	py := pikaPython(t)
	_, _, url := start(t, amqp.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "compat/pika_compat.py", url).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "checks passed") {
		t.Fatalf("pika_compat.py: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}

// The peer's own suite in make test: amqp091-go's integration tests,
// unmodified, from the version in go.mod (copied out of the module
// cache), against this package's listener, as make amqp-compat runs them
// against a warrend. A failure not in compat/amqp091-known-failures.txt
// fails it. About 5 s warm (the suite's test binary is cached), more on a
// cold build cache; not under -race (it is the same listener).
func TestAMQP091Suite(t *testing.T) {
	if raceEnabled {
		t.Skip("run once, without -race")
	}
	t.Parallel() // its own broker and go test
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	mod, err := exec.Command(gobin, "list", "-m", "-f", "{{.Dir}}", "github.com/rabbitmq/amqp091-go").Output()
	if err != nil || len(strings.TrimSpace(string(mod))) == 0 {
		if err == nil { // in go.mod but not downloaded yet
			out, derr := exec.Command(gobin, "mod", "download", "-json", "github.com/rabbitmq/amqp091-go").CombinedOutput()
			var d struct{ Dir string }
			if derr != nil || json.Unmarshal(out, &d) != nil || d.Dir == "" {
				t.Fatalf("go mod download github.com/rabbitmq/amqp091-go: %v\n%s", derr, out)
			}
			mod = []byte(d.Dir)
		} else {
			t.Fatalf("go list -m github.com/rabbitmq/amqp091-go: %v", err)
		}
	}
	dir := filepath.Join(t.TempDir(), "amqp091-go")
	if err := os.CopyFS(dir, os.DirFS(strings.TrimSpace(string(mod)))); err != nil {
		t.Fatal(err)
	}
	known, err := os.ReadFile("compat/amqp091-known-failures.txt")
	if err != nil {
		t.Fatal(err)
	}
	_, _, url := start(t, amqp.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "test", "-count=1", "-tags", "integration", "-run", "Integration", "-timeout", "3m", "-v", ".")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "AMQP_URL="+url, "GOWORK=off", "GOFLAGS=-mod=mod")
	out, _ := cmd.CombinedOutput()
	pass := strings.Count(string(out), "\n--- PASS: TestIntegration")
	var unexpected []string
	fails := 0
	for _, line := range strings.Split(string(out), "\n") {
		name, ok := strings.CutPrefix(line, "--- FAIL: ")
		if !ok {
			continue
		}
		fails++
		name, _, _ = strings.Cut(name, " ")
		if !strings.Contains(string(known), "\n"+name+":") {
			unexpected = append(unexpected, name)
		}
	}
	t.Logf("amqp091-go integration tests: %d of %d pass", pass, pass+fails)
	if pass == 0 || len(unexpected) > 0 {
		t.Fatalf("failing and not in compat/amqp091-known-failures.txt: %v\n%s", unexpected, out)
	}
}
