package netio_test

import (
	"context"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
)

// TestMeasureDeclareStorm is the full-size declare storm of issue 11 item
// 12 (WARREN_STORM_FULL=1): 10,000 pipelined declares and 10,000 binds on
// one connection beside a 2,000 msg/s publisher/consumer pair with 1 s
// heartbeats. It reports the deliveries in each 1-second window.
func TestMeasureDeclareStorm(t *testing.T) {
	if os.Getenv("WARREN_STORM_FULL") == "" {
		t.Skip("WARREN_STORM_FULL=1 runs the full-size declare storm")
	}
	const storm = 10_000
	s := warrentest.StartServer(t, &netio.Config{HeartbeatMs: 1000})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pc, err := client.Dial(ctx, warrentest.URL(s))
	must(t, err)
	cc, err := client.Dial(ctx, warrentest.URL(s))
	must(t, err)
	pub, _ := pc.Channel(ctx)
	sub, _ := cc.Channel(ctx)
	pub.DeclareQueue(ctx, "pair", client.QueueOptions{})
	var delivered atomic.Int64
	_, err = sub.ConsumeFunc(ctx, "pair", client.ConsumeOptions{AutoAck: true}, func(*client.Delivery) { delivered.Add(1) })
	must(t, err)
	stop := make(chan struct{})
	go func() {
		tk := time.NewTicker(time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
				for i := 0; i < 2; i++ {
					_, _ = pub.PublishAsync(ctx, "", client.Message{RoutingKey: "pair", Body: []byte("x")})
				}
			}
		}
	}()
	time.Sleep(2 * time.Second) // the pair's steady state before the storm
	r := rawDial(t, s, 0)
	var b []byte
	b = wire.AppendFrame(b, 1, &wire.ChannelOpen{Req: 1})
	for i := 0; i < storm; i++ {
		b = wire.AppendFrame(b, 1, &wire.QueueDeclare{Req: uint32(2 + i), Name: "storm-" + strconv.Itoa(i)})
	}
	for i := 0; i < storm; i++ {
		b = wire.AppendFrame(b, 1, &wire.Bind{Req: uint32(2 + storm + i), Source: "amq.direct", Destination: "storm-" + strconv.Itoa(i), RoutingKey: "k" + strconv.Itoa(i)})
	}
	var answered atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		var buf []byte
		tmp := make([]byte, 64<<10)
		for answered.Load() < 2*storm+1 {
			f, n, err := wire.Split(buf, wire.HardMaxFrame)
			if err != nil {
				return
			}
			if n == 0 {
				_ = r.nc.SetReadDeadline(time.Now().Add(5 * time.Minute))
				m, err := r.nc.Read(tmp)
				if err != nil {
					return
				}
				buf = append(buf, tmp[:m]...)
				continue
			}
			buf = buf[n:]
			if f.Type == wire.TypeOK || f.Type == wire.TypeQueueDeclareOK {
				answered.Add(1)
			}
		}
	}()
	start := time.Now()
	go func() { _, _ = r.nc.(*net.TCPConn).Write(b) }()
	var windows []int64
	last := delivered.Load()
	tk := time.NewTicker(time.Second)
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tk.C:
			n := delivered.Load()
			windows = append(windows, n-last)
			last = n
		}
	}
	tk.Stop()
	took := time.Since(start)
	close(stop)
	minW := int64(-1)
	for _, w := range windows {
		if minW < 0 || w < minW {
			minW = w
		}
	}
	t.Logf("storm: %d of %d answered in %v; pair deliveries per second during it: %v (min %d); connections open: %d",
		answered.Load(), 2*storm+1, took.Round(time.Millisecond), windows, minW, s.ConnectionCount())
	if pc.Err() != nil || cc.Err() != nil {
		t.Errorf("the pair was disconnected: %v / %v", pc.Err(), cc.Err())
	}
}
