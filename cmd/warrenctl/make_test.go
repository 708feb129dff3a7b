package main

import (
	"os/exec"
	"strings"
	"testing"
)

// `make build` writes the three binaries the README uses to bin/.
func TestMakeBuildWritesEveryBinary(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	out, err := exec.Command("make", "-n", "-C", "../..", "build").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n build: %v\n%s", err, out)
	}
	for _, bin := range []string{"bin/warrend", "bin/warrenctl", "bin/warren-loadtest"} {
		if !strings.Contains(string(out), "-o "+bin+" ") {
			t.Errorf("make build does not write %s:\n%s", bin, out)
		}
	}
}
