package abuse

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// pending lists the probes the scaled-down run leaves out, and why
// (RELIABILITY.md has their full-size numbers).
var pending = map[string]string{
	// Holds at full size (256 MiB watermark: 303 of 318 MiB), not at the
	// Small 128 MiB: the watermark is checked between frames and one 4 MiB
	// frame is 209,664 empty messages, a large overshoot next to a small
	// watermark (170-175 MiB against 165).
	"empty-body-flood": "item 10: one max-size frame overshoots a 128 MiB watermark past its bound",
}

var (
	buildOnce sync.Once
	buildDir  string
	buildBin  string
	buildErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// buildBroker builds warrend once for the package's tests.
func buildBroker(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		if buildDir, buildErr = os.MkdirTemp("", "warren-abuse-bin-"); buildErr != nil {
			return
		}
		buildBin = filepath.Join(buildDir, "warrend")
		out, err := exec.Command("go", "build", "-o", buildBin, "github.com/warren-mq/warren/cmd/warrend").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("building warrend: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildBin
}

// TestAbuseSmall runs the suite at Small sizes against warrend child
// processes: each hostile client for a few seconds beside the 2,000 msg/s
// pair. `make abuse` is the full-size run.
func TestAbuseSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts brokers and runs load for tens of seconds")
	}
	if raceEnabled {
		t.Skip("load and timing bounds: not run under the race detector")
	}
	var run []string
	for _, p := range Probes() {
		if why, ok := pending[p.Name]; ok {
			t.Logf("%s: left out of the scaled-down run (issue 11 %s)", p.Name, why)
			continue
		}
		run = append(run, p.Name)
	}
	if len(run) == 0 {
		t.Skip("no probe's fix has landed yet")
	}
	bin := buildBroker(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var log strings.Builder
	rs, err := Run(ctx, Options{Bin: bin, Sizes: Small(), Only: run, Log: &log})
	t.Log("\n" + log.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if !r.OK() {
			t.Errorf("%s: %s", r.Probe, strings.Join(r.Failures, "; "))
		}
	}
}

// TestHarnessControl runs the harness with a probe that does nothing: the
// broker starts, the pair runs and loses nothing, RSS is read, and the
// broker answers. It keeps the harness honest while probes are pending.
func TestHarnessControl(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a broker and runs the pair for seconds")
	}
	bin := buildBroker(t)
	s := Small()
	s.Duration = 2 * time.Second
	control := Probe{Name: "control", RSSAllowance: socketsAllowance, run: func(ctx context.Context, e *env, r *Result) {
		r.Tried = "nothing for " + e.s.Duration.String()
		select {
		case <-ctx.Done():
		case <-time.After(e.s.Duration):
		}
	}}
	r := RunProbe(context.Background(), bin, s, control)
	var b strings.Builder
	r.Print(&b)
	t.Log("\n" + b.String())
	if !r.OK() {
		t.Fatalf("control: %s", strings.Join(r.Failures, "; "))
	}
	// The peak is the probe's window only (the high-water mark is reset
	// after the baseline): it may be a little under the baseline when the
	// runtime hands memory back meanwhile (CI: 23.33 MB against 23.42).
	if r.Confirmed < PairRate || r.Consumed < r.Confirmed || r.RSSBaseline == 0 || r.RSSPeak == 0 || !r.BrokerUp {
		t.Fatalf("control: implausible result %+v", r)
	}
}

// TestProbeNamesAreUnique keeps --probe and the pending table honest.
func TestProbeNamesAreUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, p := range Probes() {
		if seen[p.Name] {
			t.Fatalf("probe %q twice", p.Name)
		}
		seen[p.Name] = true
	}
	for n := range pending {
		if !seen[n] {
			t.Fatalf("pending names a probe that does not exist: %q", n)
		}
	}
}
