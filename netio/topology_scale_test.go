package netio

import (
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
)

// declareAndBindPipelined declares n queues q<i> and binds each to the
// topic exchange ex with key q.<i>, over one connection, pipelined: the
// client writes every request without waiting for an answer (256 queues
// per write) while it reads the answers; it returns when all are answered.
func declareAndBindPipelined(t testing.TB, addr, ex string, n int) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var b []byte
	b = append(b, wire.Preamble[:]...)
	b = wire.AppendFrame(b, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame})
	b = wire.AppendFrame(b, 1, &wire.ChannelOpen{Req: 1})
	b = wire.AppendFrame(b, 1, &wire.ExchangeDeclare{Req: 2, Name: ex, Kind: wire.ExchangeTopic})
	if _, err := nc.Write(b); err != nil {
		t.Fatal(err)
	}
	go func() {
		const chunk = 256 // queues per write: 2 requests each
		var b []byte
		for i := 0; i < n; {
			b = b[:0]
			for j := 0; j < chunk && i < n; j, i = j+1, i+1 {
				name := "q" + strconv.Itoa(i)
				b = wire.AppendFrame(b, 1, &wire.QueueDeclare{Req: uint32(3 + 2*i), Name: name})
				b = wire.AppendFrame(b, 1, &wire.Bind{Req: uint32(4 + 2*i), Source: ex, Destination: name, RoutingKey: "q." + strconv.Itoa(i)})
			}
			if _, err := nc.Write(b); err != nil {
				return
			}
		}
	}()
	var buf []byte
	tmp := make([]byte, 256<<10)
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Minute))
	for answered := 0; answered < 2*n+1; {
		f, m, err := wire.Split(buf, wire.HardMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		if m == 0 {
			k, err := nc.Read(tmp)
			if err != nil {
				t.Fatalf("after %d answers: %v", answered, err)
			}
			buf = append(buf, tmp[:k]...)
			continue
		}
		buf = buf[m:]
		switch f.Type {
		case wire.TypeOK, wire.TypeQueueDeclareOK:
			answered++
		case wire.TypeError, wire.TypeClose:
			body, _ := wire.Decode(f, wire.HardMaxFrame, nil)
			t.Fatalf("refused after %d answers: %v %+v", answered, f.Type, body)
		}
	}
}

// TestTopologyScale is the topology benchmark of BENCHMARKS.md (make
// bench-topology): WARREN_TOPOLOGY_QUEUES=100000 queues declared and
// bound, pipelined by one client over loopback, against the real server;
// it reports the wall time and the heap and RSS per queue. Skipped unless
// the variable is set. WARREN_TOPOLOGY_DATA=1 runs it as warrend does, with
// a data directory: every control run is then one entry of the metadata
// log and one fdatasync.
func TestTopologyScale(t *testing.T) {
	nv := os.Getenv("WARREN_TOPOLOGY_QUEUES")
	if nv == "" {
		t.Skip("set WARREN_TOPOLOGY_QUEUES (make bench-topology)")
	}
	for _, f := range strings.Split(nv, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 1 {
			t.Fatalf("WARREN_TOPOLOGY_QUEUES=%q: want queue counts, comma-separated", nv)
		}
		t.Run(f, func(t *testing.T) { topologyScale(t, n) })
	}
}

func topologyScale(t *testing.T, n int) {
	cfg := Config{Addr: "127.0.0.1:0"}
	if os.Getenv("WARREN_TOPOLOGY_DATA") != "" {
		cfg.DataDir = t.TempDir()
	}
	s, err := Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Close(t.Context()) }()
	heap0, rss0 := heapAndRSS()
	cpu0 := cpuTime()
	start := time.Now()
	declareAndBindPipelined(t, s.Addr().String(), "bench.topic", n)
	wall := time.Since(start)
	cpu := cpuTime() - cpu0
	heap1, rss1 := heapAndRSS()
	t.Logf("%d queues declared and bound: %v (%.1f µs per queue; CPU %v, client included), heap %+.0f B/queue, RSS %+.0f B/queue (RSS %d MiB)",
		n, wall.Round(time.Millisecond), float64(wall.Microseconds())/float64(n), cpu.Round(time.Millisecond),
		float64(heap1-heap0)/float64(n), float64(rss1-rss0)/float64(n), rss1>>20)
}

// cpuTime is the CPU time (user and system) the process has used: on a
// shared machine, steadier than the wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// heapAndRSS is the live heap after a collection and the process's
// resident set (/proc/self/status VmRSS), in bytes.
func heapAndRSS() (heap, rss int64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	b, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				rss = kb << 10
			}
		}
	}
	return int64(ms.HeapAlloc), rss
}
