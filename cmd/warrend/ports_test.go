package main

import (
	"testing"

	"github.com/warren-mq/warren/internal/freeport"
)

// Ports the tests hand to warrend are drawn outside the kernel's
// ephemeral range (freeport): a listener on 127.0.0.1:0, warrend's own
// included, is never given one, so the port checked free here is not
// taken by the process the test then starts.

// freePorts returns n distinct loopback addresses nothing listened on
// when checked, outside the ephemeral range.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	a, err := freeport.Addrs(n)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// freeAddr is one loopback address from freePorts.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freePorts(t, 1)[0]
}
