package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func TestMissingBinarySaysHowToBuild(t *testing.T) {
	var out, errb bytes.Buffer
	if rc := run(context.Background(), []string{"--warrend", "/nonexistent/warrend"}, &out, &errb); rc != 2 || !strings.Contains(errb.String(), "make build") {
		t.Fatalf("exit %d: %q", rc, errb.String())
	}
}

// TestShortRun is the short version of make jepsen: a warrend built
// from this tree, killed with SIGKILL in the power-loss mode (and, but
// under -race, plainly) for two seconds under confirmed persistent load;
// then healed, drained and checked: nothing confirmed lost, nothing
// invented.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds warrend and starts it")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "warrend")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/warren-mq/warren/cmd/warrend").CombinedOutput(); err != nil {
		t.Fatalf("go build warrend: %v\n%s", err, out)
	}
	classes := "powerloss,kill"
	if raceEnabled {
		classes = "powerloss"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out, errb bytes.Buffer
	rc := run(ctx, []string{"--warrend", bin, "--classes", classes, "--time", "2s", "--rate", "300", "--dir", filepath.Join(dir, "run")}, &out, &errb)
	t.Logf("%s%s", out.String(), errb.String())
	if rc != 0 {
		t.Fatalf("exit %d", rc)
	}
	if !regexp.MustCompile(`(?m)^lost=0 duplicated=\d+ invented=0$`).MatchString(out.String()) {
		t.Fatal("no final line lost=0 duplicated=N invented=0")
	}
	for _, c := range strings.Split(classes, ",") {
		m := regexp.MustCompile(`(?m)^\| ` + c + ` \| (\d+) \| (\d+) \| (\d+) \| (\d+) \|`).FindStringSubmatch(out.String())
		if m == nil {
			t.Fatalf("no table row for %s", c)
		}
		if m[1] == "0" || m[3] == "0" || m[4] == "0" {
			t.Errorf("%s: events %s, confirmed %s, consumed %s: the run did nothing", c, m[1], m[3], m[4])
		}
	}
}
