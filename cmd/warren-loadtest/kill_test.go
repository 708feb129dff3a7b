package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/loadtest"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestBrokerChild is a broker on a data directory in a child process for
// the kill tests (LOADTEST_BROKER_CHILD names the directory): the test
// binary re-runs itself with -test.run=TestBrokerChild, and the child
// prints its address once serving, then serves until killed.
func TestBrokerChild(t *testing.T) {
	data := os.Getenv("LOADTEST_BROKER_CHILD")
	if data == "" {
		t.Skip("the broker child of TestKill9Ledger")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	// No soft limit: the publish-only phases leave a backlog larger than
	// the 20,000 ready messages at which a queue holds back confirms.
	s, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", DataDir: data, QueueSoftLimit: -1, DiskFreeLimit: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, "broker child:", err)
		os.Exit(1)
	}
	fmt.Printf("READY %s\n", s.Addr())
	<-ctx.Done()
	_ = s.Close(context.Background())
}

func startBroker(t *testing.T, data string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestBrokerChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "LOADTEST_BROKER_CHILD="+data)
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
			if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "READY" {
				addr <- f[1]
			}
		}
		close(addr)
	}()
	select {
	case a, ok := <-addr:
		if !ok {
			t.Fatal("broker child exited before serving")
		}
		return cmd, "warren://guest:guest@" + a
	case <-time.After(30 * time.Second):
		t.Fatal("broker child did not start")
	}
	return nil, ""
}

// TestKill9Ledger: persistent load with --ledger while the broker is
// killed with SIGKILL mid-run, KILLS times, restarted each time on the same
// data directory; then --verify consumes everything and finds no confirmed
// message missing (duplicates are expected: redeliveries of what was
// consumed and not yet acked at a kill). Every other phase publishes
// only, so the queues hold a backlog across kills. LOADTEST_KILLS raises the count
// (make soak-kill).
func TestKill9Ledger(t *testing.T) {
	if testing.Short() {
		t.Skip("starts broker processes")
	}
	kills, perKill := 5, int64(2000)
	if v, _ := strconv.Atoi(os.Getenv("LOADTEST_KILLS")); v > 0 {
		kills, perKill = v, 50000
	}
	dir := t.TempDir()
	data, ledger := filepath.Join(dir, "data"), filepath.Join(dir, "ledger.json")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(60+30*kills)*time.Second)
	defer cancel()
	var confirmed int64
	for k := 0; k < kills; k++ {
		cmd, url := startBroker(t, data)
		live := &loadtest.Live{}
		done := make(chan error, 1)
		var out bytes.Buffer
		go func() {
			_, err := loadtest.Run(ctx, loadtest.Config{URL: url, Producers: 2, Queues: 2, Size: "200", Persistent: true,
				ConfirmWindow: 500, Duration: time.Minute, Ledger: ledger, Live: live, PublishOnly: k%2 == 0}, &out)
			done <- err
		}()
		// Mid-run: once this phase has perKill confirms, kill -9.
		tick := time.NewTicker(5 * time.Millisecond)
		for _, c, _ := live.Totals(); c < perKill; _, c, _ = live.Totals() {
			select {
			case <-tick.C:
			case err := <-done:
				t.Fatalf("phase %d ended before the kill: %v\n%s", k, err, out.String())
			case <-ctx.Done():
				t.Fatalf("phase %d: %d confirms before the deadline, want %d\n%s", k, c, perKill, out.String())
			}
		}
		tick.Stop()
		_, c, _ := live.Totals()
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		// The producers see the broker go away: the phase ends cleanly
		// and the ledger is written.
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("phase %d after the kill: %v\n%s", k, err, out.String())
			}
		case <-ctx.Done():
			t.Fatalf("phase %d did not end after the kill\n%s", k, out.String())
		}
		confirmed += c
	}
	_, url := startBroker(t, data)
	var out, errb bytes.Buffer
	code := run(ctx, []string{"--verify", ledger, "--url", url, "--quiet", "2s"}, &out, &errb)
	t.Logf("%d kills, at least %d confirmed\n%s%s", kills, confirmed, out.String(), errb.String())
	if code != 0 {
		t.Fatalf("--verify exit %d after %d kills", code, kills)
	}
	if strings.Contains(out.String(), ", 0 not yet received") {
		t.Error("--verify had nothing to consume: the publish-only phases left no backlog")
	}
	for _, want := range []string{"lost 0 ", "duplicates "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("--verify report lacks %q", want)
		}
	}
}

// TestVerifyReportsLoss: a ledger that says messages were confirmed which
// the broker never had makes --verify list them and exit 3.
func TestVerifyReportsLoss(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ledger := filepath.Join(t.TempDir(), "ledger.json")
	var out, errb bytes.Buffer
	code := run(ctx, []string{"--url", warrentest.URL(s), "--persistent", "--consumers", "1", "--count", "2000", "--ledger", ledger}, &out, &errb)
	if code != 0 {
		t.Fatalf("load exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	b, err := os.ReadFile(ledger)
	if err != nil {
		t.Fatal(err)
	}
	// Claim 5 more confirms than were published.
	b = bytes.Replace(b, []byte(`"confirmed": "1-2000"`), []byte(`"confirmed": "1-2000,3001-3005"`), 1)
	if err := os.WriteFile(ledger, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	code = run(ctx, []string{"--verify", ledger, "--url", warrentest.URL(s), "--quiet", "300ms"}, &out, &errb)
	if code != 3 || !strings.Contains(out.String(), "lost 5 ") || !strings.Contains(out.String(), "producer 0: 3001-3005") {
		t.Fatalf("--verify: exit %d, want 3 and the lost range listed\n%s\n%s\nledger %s", code, out.String(), errb.String(), b)
	}
}
