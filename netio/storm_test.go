package netio_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestDeclareStormDoesNotStarveOthers: thousands of pipelined declares and
// binds on one connection do not hold up another client on the same event
// loop: its publish is confirmed while the storm is still being answered.
// The storm is pipelined behind a (deliberately slow, bcrypt cost 8) AUTH, so the
// broker has all of it buffered when it starts on it.
func TestDeclareStormDoesNotStarveOthers(t *testing.T) {
	const storm = 5000 // declares, then as many binds
	hash, err := bcrypt.GenerateFromPassword([]byte("storm"), 8)
	must(t, err)
	// The handshake deadline (10 s by default, counted from accept) is not
	// what this test is about, and the AUTH is slow on purpose: ~0.2 s of
	// bcrypt under -race, many seconds on a loaded machine, where the
	// deadline closed the storm connection before OPEN_OK.
	s := warrentest.StartServer(t, &netio.Config{EventLoops: 1, HandshakeTimeout: 2 * time.Minute,
		Users: []netio.User{{Name: "storm", PasswordHash: string(hash)}}})
	ctx := ctxT(t)
	good := channel(t, dial(t, s))
	good.DeclareQueue(ctx, "pair", client.QueueOptions{})

	// The storm is built before dialing: the broker's handshake clock runs
	// from accept.
	var b []byte
	b = append(b, wire.Preamble[:]...)
	b = wire.AppendFrame(b, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse("storm", "storm"), MaxFrame: wire.MinMaxFrame})
	b = wire.AppendFrame(b, 1, &wire.ChannelOpen{Req: 1})
	for i := 0; i < storm; i++ {
		b = wire.AppendFrame(b, 1, &wire.QueueDeclare{Req: uint32(2 + i), Name: "storm-" + strconv.Itoa(i)})
	}
	for i := 0; i < storm; i++ {
		b = wire.AppendFrame(b, 1, &wire.Bind{Req: uint32(2 + storm + i), Source: "amq.direct", Destination: "storm-" + strconv.Itoa(i), RoutingKey: "k" + strconv.Itoa(i)})
	}
	nc, err := net.Dial("tcp", s.Addr().String())
	must(t, err)
	t.Cleanup(func() { nc.Close() })
	opened := make(chan struct{})
	var answered atomic.Int64
	stormDone := make(chan struct{})
	var stopped string // why the reader stopped early; read after stormDone
	sent := time.Now()
	go func() {
		defer close(stormDone)
		r := &rawConn{t: t, nc: nc}
		_ = nc.SetReadDeadline(time.Now().Add(3 * time.Minute))
		for answered.Load() < 2*storm+1 {
			f, n, err := wire.Split(r.buf, wire.HardMaxFrame)
			if err != nil {
				stopped = "bad frame: " + err.Error()
				return
			}
			if n == 0 {
				tmp := make([]byte, 64<<10)
				m, err := nc.Read(tmp)
				if err != nil {
					stopped = "read: " + err.Error()
					return
				}
				r.buf = append(r.buf, tmp[:m]...)
				continue
			}
			r.buf = r.buf[n:]
			switch f.Type {
			case wire.TypeOpenOK:
				close(opened)
			case wire.TypeOK, wire.TypeQueueDeclareOK:
				answered.Add(1)
			case wire.TypeError, wire.TypeClose:
				b, err := wire.Decode(f, wire.HardMaxFrame, nil)
				stopped = fmt.Sprintf("%v %+v (decode error %v)", f.Type, b, err)
				return
			}
		}
	}()
	go func() { _, _ = nc.Write(b) }()
	select {
	case <-opened:
	case <-stormDone:
		t.Fatalf("the storm connection was not opened: %s, %v after it sent its AUTH", stopped, time.Since(sent))
	}
	// The broker is now working through the storm. The publish gets a
	// clock of its own (ctx's may be mostly spent by a slow handshake): it
	// only guards against a hang; the assertion is on the storm's progress.
	pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer pcancel()
	start := time.Now()
	must(t, good.Publish(pctx, "", client.Message{RoutingKey: "pair", Body: []byte("x")}))
	waited, n := time.Since(start), answered.Load()
	t.Logf("confirmed after %v with %d of %d storm requests answered", waited, n, 2*storm+1)
	if n == 2*storm+1 {
		t.Fatalf("the other client's publish waited for the whole storm (%v)", waited)
	}
}
