package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"--no-such-flag"},
		{"extra-argument"},
		{"--bin", "/nonexistent/warrend"},
	} {
		var out, errOut bytes.Buffer
		if rc := run(args, &out, &errOut); rc != 2 {
			t.Errorf("%q: exit %d, want 2 (%s)", args, rc, errOut.String())
		}
	}
	var out, errOut bytes.Buffer
	if rc := run([]string{"--bin", "/nonexistent/warrend"}, &out, &errOut); !strings.Contains(errOut.String(), "make build") {
		t.Errorf("exit %d; a missing binary should say how to build it: %q", rc, errOut.String())
	}
}
