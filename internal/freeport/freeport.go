// Package freeport picks loopback ports for tests and harnesses that hand
// a port to another process (a warrend they start) or listen on it again
// later (a node restarted on its address).
//
// A port taken from a listener on 127.0.0.1:0 and freed is in the
// kernel's ephemeral range, from which every later 127.0.0.1:0 listener
// and every outgoing connection's local port is drawn: the process given
// it, another test, or a dial may take it first (CI: warrend's own
// 127.0.0.1:0 listener took its --amqp-listen port; commit 6d63575). So
// the ports here are drawn outside that range, where the kernel never
// assigns one by itself, and checked free by listening on them. Two
// pickers (two test processes) may still meet on a port handed on in the
// moment between check and use; with a few thousand ports to draw from
// that is rare, where the ephemeral range made it likely.
package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// minSpan is the fewest ports a range outside the ephemeral one must hold
// to be drawn from.
const minSpan = 1000

// Range is the ports [lo, hi) drawn from: below the kernel's ephemeral
// range (Linux: /proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by
// default), from 20000 at most 12768 of them; above it when too few lie
// below; [20000, 32768) when the range cannot be read (other systems:
// their ephemeral ranges start at 32768 or 49152).
func Range() (lo, hi int) {
	elo, ehi, ok := ephemeral()
	switch {
	case !ok:
		return 20000, 32768
	case elo-1024 >= minSpan:
		hi = elo
		return max(1024, hi-12768), hi
	case 65536-(ehi+1) >= minSpan:
		return ehi + 1, min(65536, ehi+1+12768)
	}
	return 20000, 32768 // nothing outside it: as good as any
}

// ephemeral reads the kernel's ephemeral port range.
func ephemeral() (lo, hi int, ok bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, 0, false
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	return lo, hi, err1 == nil && err2 == nil && 0 < lo && lo <= hi && hi < 65536
}

// Ephemeral reports whether the kernel may assign port by itself (to a
// 127.0.0.1:0 listener or a dial); false where the range cannot be read.
func Ephemeral(port int) bool {
	lo, hi, ok := ephemeral()
	return ok && lo <= port && port <= hi
}

const tries = 1000

// Addrs returns n distinct loopback addresses (127.0.0.1:port) nothing
// listened on when checked, their ports drawn from Range.
func Addrs(n int) ([]string, error) {
	lo, hi := Range()
	var out []string
	seen := map[int]bool{}
	for try := 0; len(out) < n; try++ {
		if try == tries {
			return nil, fmt.Errorf("freeport: no free loopback port in [%d, %d) after %d tries", lo, hi, tries)
		}
		p := lo + rand.IntN(hi-lo)
		if seen[p] {
			continue
		}
		seen[p] = true
		a := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		l, err := net.Listen("tcp", a)
		if err != nil {
			continue
		}
		if err := l.Close(); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// Addr is one address of Addrs.
func Addr() (string, error) {
	a, err := Addrs(1)
	if err != nil {
		return "", err
	}
	return a[0], nil
}

// Listen listens on a loopback port drawn from Range: held from the
// start, and safe to listen on again after a Close (a node restarted on
// its address), as no ephemeral port is.
func Listen() (net.Listener, error) {
	lo, hi := Range()
	var last error
	for range tries {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+rand.IntN(hi-lo))))
		if err == nil {
			return l, nil
		}
		last = err
	}
	return nil, errors.Join(fmt.Errorf("freeport: no free loopback port in [%d, %d) after %d tries", lo, hi, tries), last)
}
