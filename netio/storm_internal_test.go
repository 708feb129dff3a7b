package netio

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/warren-mq/warren/wire"
)

// TestStormRebuildsTheViewPerRun: a run of pipelined declares and binds
// rebuilds the routing view once per run handled off the loop, not once
// per request (each rebuild is O(topology): per request, a storm is
// quadratic).
func TestStormRebuildsTheViewPerRun(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	nc, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	const storm = 1000
	var b []byte
	b = append(b, wire.Preamble[:]...)
	b = wire.AppendFrame(b, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("guest", "guest"), MaxFrame: wire.MinMaxFrame})
	b = wire.AppendFrame(b, 1, &wire.ChannelOpen{Req: 1})
	for i := 0; i < storm; i++ {
		b = wire.AppendFrame(b, 1, &wire.QueueDeclare{Req: uint32(2 + i), Name: "q" + strconv.Itoa(i)})
		b = wire.AppendFrame(b, 1, &wire.Bind{Req: uint32(2 + storm + i), Source: "amq.direct", Destination: "q" + strconv.Itoa(i), RoutingKey: "k"})
	}
	before := s.ViewRebuilds()
	go func() { _, _ = nc.Write(b) }()
	var buf []byte
	tmp := make([]byte, 64<<10)
	_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	for answered := 0; answered < 2*storm; {
		f, n, err := wire.Split(buf, wire.HardMaxFrame)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			m, err := nc.Read(tmp)
			if err != nil {
				t.Fatal(err)
			}
			buf = append(buf, tmp[:m]...)
			continue
		}
		buf = buf[n:]
		switch f.Type {
		case wire.TypeOK, wire.TypeQueueDeclareOK:
			answered++
		case wire.TypeError, wire.TypeClose:
			t.Fatalf("storm refused: %v", f.Type)
		}
	}
	got := s.ViewRebuilds() - before
	t.Logf("%d requests, %d view rebuilds", 2*storm, got)
	if got > 2*storm/10 {
		t.Fatalf("%d routing-view rebuilds for %d pipelined declares and binds", got, 2*storm)
	}
}
