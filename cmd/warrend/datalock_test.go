//go:build unix

package main

import (
	"context"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A second warrend on a data directory a running one holds is refused
// (exit 1, saying so) before it opens anything there: before, it started
// and both wrote the same log and incarnation files. Once the first stops,
// the directory takes a warrend again.
func TestDataDirOfARunningWarrendIsRefused(t *testing.T) {
	data := t.TempDir()
	args := []string{"--data", data, "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--log-level", "warn"}
	env := func(k string) string {
		if k == "WARREN_DISK_FREE_LIMIT" {
			return "-1"
		}
		return ""
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args, env, strings.NewReader(""), io.Discard, io.Discard, func(net.Addr, net.Addr) { close(ready) })
	}()
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("the first warrend: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first warrend did not serve within 30 s")
	}

	// The second stops as soon as it serves, so the test fails rather than
	// waits when it is not refused.
	ctx2, cancel2 := context.WithCancel(context.Background())
	var served atomic.Bool
	err := run(ctx2, args, env, strings.NewReader(""), io.Discard, io.Discard, func(net.Addr, net.Addr) { served.Store(true); cancel2() })
	cancel2()
	if served.Load() || err == nil || !strings.Contains(err.Error(), "in use by another warrend") || exitCode(err) != 1 {
		t.Fatalf("a second warrend on the same --data: served %v, err %v (exit %d); want it refused, exit 1", served.Load(), err, exitCode(err))
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("the first warrend's stop: %v", err)
	}
	ctx3, cancel3 := context.WithCancel(context.Background())
	defer cancel3()
	if err := run(ctx3, args, env, strings.NewReader(""), io.Discard, io.Discard, func(net.Addr, net.Addr) { cancel3() }); err != nil {
		t.Fatalf("a warrend on the directory after the first stopped: %v", err)
	}
}
