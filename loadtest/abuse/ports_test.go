package abuse

import (
	"testing"

	"github.com/warren-mq/warren/internal/freeport"
)

// TestFreePortOutsideEphemeralRange: the ports the suite hands to the
// warrend it starts lie outside the kernel's ephemeral range, which
// warrend's own 127.0.0.1:0 listeners or any dial may take while the port
// is free.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	for range 20 {
		p, err := freePort()
		if err != nil {
			t.Fatal(err)
		}
		if freeport.Ephemeral(p) {
			t.Fatalf("freePort gave %d, in the kernel's ephemeral range", p)
		}
	}
}
