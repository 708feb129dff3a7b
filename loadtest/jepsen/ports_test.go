package jepsen

import (
	"net"
	"strconv"
	"testing"

	"github.com/warren-mq/warren/internal/freeport"
)

// TestFreePortOutsideEphemeralRange: the ports the harness hands to the
// warrend nodes (and restarts them on, again and again) lie outside the
// kernel's ephemeral range, which a node's own 127.0.0.1:0 listener or
// any dial may take while the port is free.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	for range 20 {
		a, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		_, p, _ := net.SplitHostPort(a)
		n, _ := strconv.Atoi(p)
		if freeport.Ephemeral(n) {
			t.Fatalf("freePort gave %s, in the kernel's ephemeral range", a)
		}
	}
}
