//go:build linux

package queue

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/warren-mq/warren/wire"
)

// threadCPU is this thread's CPU time (CLOCK_THREAD_CPUTIME_ID): unlike
// the wall clock, it does not count the time the thread waits for a core,
// which on a shared, loaded machine is most of the noise.
func threadCPU() time.Duration {
	var ts syscall.Timespec
	const clockThreadCPUTimeID = 3
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, clockThreadCPUTimeID, uintptr(unsafe.Pointer(&ts)), 0)
	return time.Duration(ts.Nano())
}

// TestRouteCPURatio (WARREN_ROUTE_RATIO=1; about a minute) compares Routes
// with the compiled table on the BenchmarkRoute setups: 300 rounds of
// 20,000 routes through each, alternated, timed in thread CPU time; it
// logs each one's mean and the median and quartiles of the per-round
// ratio routes/compiled. A steadier comparison than benchstat's on a
// loaded machine (same code, same setups; the machine still shares caches).
func TestRouteCPURatio(t *testing.T) {
	if os.Getenv("WARREN_ROUTE_RATIO") == "" {
		t.Skip("set WARREN_ROUTE_RATIO=1 to run (about a minute)")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	mk := func(kind wire.ExchangeKind, queues int, bind func(i int, q string) Binding) *Topology {
		top := NewTopology()
		top.Exchanges["x"] = Exchange{Name: "x", Kind: kind}
		for i := 0; i < queues; i++ {
			q := fmt.Sprintf("queue-%d", i)
			top.Queues[q] = struct{}{}
			top.Bindings = append(top.Bindings, bind(i, q))
		}
		return top
	}
	hdr := wire.AppendTable(nil, wire.Table{{Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(3)}})[4:]
	for _, s := range []struct {
		name    string
		top     *Topology
		ex, key string
		headers []byte
	}{
		{"direct", mk(wire.ExchangeDirect, 100, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Key: fmt.Sprintf("key-%d", i)}
		}), "x", "key-42", nil},
		{"fanout", mk(wire.ExchangeFanout, 10, func(i int, q string) Binding { return Binding{Source: "x", Destination: q} }), "x", "k", nil},
		{"headers", mk(wire.ExchangeHeaders, 10, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Args: wire.Table{{Key: "region", Value: wire.String("eu")}, {Key: "tier", Value: wire.Int(int64(i))}}}
		}), "x", "", hdr},
		{"hash", mk(wire.ExchangeConsistentHash, 10, func(i int, q string) Binding { return Binding{Source: "x", Destination: q} }), "x", "user-42", nil},
		{"hash-weighted", mk(wire.ExchangeConsistentHash, 10, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Key: strconv.Itoa(1 + i%3)}
		}), "x", "user-42", nil},
		{"topic", mk(wire.ExchangeTopic, 100, func(i int, q string) Binding {
			return Binding{Source: "x", Destination: q, Key: fmt.Sprintf("order.%d.*", i)}
		}), "x", "order.42.created", nil},
		{"default", mk(wire.ExchangeDirect, 100, func(i int, q string) Binding { return Binding{Source: "x", Destination: q} }), "", "queue-42", nil},
		{"topic100k", bigTopicModel(100_000), "t", "q.12345", nil},
	} {
		ct, rt := s.top.Compile(), routesFrom(s.top).Table
		key := []byte(s.key)
		ds, dr := make([]string, 0, 16), make([]QueueRef, 0, 16)
		const rounds, n = 300, 20_000
		var ratios []float64
		var sumC, sumR time.Duration
		for round := 0; round < rounds; round++ {
			t0 := threadCPU()
			for i := 0; i < n; i++ {
				ds, _ = ct.Route(ds[:0], s.ex, key, s.headers)
			}
			t1 := threadCPU()
			for i := 0; i < n; i++ {
				dr, _ = rt.Route(dr[:0], s.ex, key, s.headers)
			}
			t2 := threadCPU()
			ratios = append(ratios, float64(t2-t1)/float64(t1-t0))
			sumC, sumR = sumC+t1-t0, sumR+t2-t1
		}
		slices.Sort(ratios)
		t.Logf("%-13s compiled %7.1f ns  routes %7.1f ns  routes/compiled median %.2f (quartiles %.2f, %.2f)", s.name,
			float64(sumC)/(rounds*n), float64(sumR)/(rounds*n), ratios[rounds/2], ratios[rounds/4], ratios[3*rounds/4])
	}
}
