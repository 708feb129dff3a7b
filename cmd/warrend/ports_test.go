package main

import (
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
)

// Ports the tests hand to warrend are drawn below the kernel's ephemeral
// range (32768 and up by default on Linux): a listener on 127.0.0.1:0,
// warrend's own included, is never given one, so the port checked free
// here is not taken by the process the test then starts.
const testPortLo, testPortHi = 20000, 32768

// freePorts returns n distinct loopback addresses nothing listened on
// when checked, below the ephemeral range.
func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	seen := map[int]bool{}
	for try := 0; len(out) < n; try++ {
		if try == 1000 {
			t.Fatalf("no free loopback port in [%d, %d) after 1000 tries", testPortLo, testPortHi)
		}
		p := testPortLo + rand.IntN(testPortHi-testPortLo)
		if seen[p] {
			continue
		}
		seen[p] = true
		a := fmt.Sprintf("127.0.0.1:%d", p)
		l, err := net.Listen("tcp", a)
		if err != nil {
			continue
		}
		l.Close()
		out = append(out, a)
	}
	return out
}

// freeAddr is one loopback address from freePorts.
func freeAddr(t *testing.T) string {
	t.Helper()
	return freePorts(t, 1)[0]
}
