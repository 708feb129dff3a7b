package amqp

import (
	"context"
	"encoding/binary"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio"
)

// A shard closes a channel (a consume refused, say) while the loop reads
// a basic.publish's body on it. Only the loop touches the channel's
// pending publish: the shard's close cleared it, racing handle's look at
// it against onBody's use (a nil dereference on the event loop; under
// -race, a data race). The publish's share of the connection's unfinished
// bodies is let go at the channel's next frame.
func TestShardCloseDuringContent(t *testing.T) {
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	const size = 64
	hdr := binary.BigEndian.AppendUint16(nil, classBasic)
	hdr = append(hdr, 0, 0)
	hdr = binary.BigEndian.AppendUint64(hdr, size)
	hdr = append(hdr, 0, 0) // no properties
	rounds := 200
	if testing.Short() {
		rounds = 20
	}
	for i := range rounds {
		c := newConn(l, netip.MustParseAddrPort("127.0.0.1:1"))
		c.user, c.channelMax = "guest", 2047
		c.opened.Store(true)
		c.state.Store(stOpen)
		step := func(typ uint8, p []byte) {
			t.Helper()
			if err := c.handle(typ, 1, p); err != nil {
				t.Fatalf("round %d: %v", i, err)
			}
		}
		step(frameMethod, method2(classChannel, 10, []byte{0}))
		step(frameMethod, method2(classBasic, 40, []byte{0, 0, 0, 1, 'q', 0}))
		step(frameHeader, hdr)
		if got := c.partial.Load(); got != size {
			t.Fatalf("round %d: %d bytes awaited, want %d", i, got, size)
		}
		c.mu.Lock()
		ch := c.channels[1]
		c.mu.Unlock()
		var wg sync.WaitGroup
		wg.Go(func() {
			ae := chErr(accessRefused, "ACCESS_REFUSED - queue 'q' in exclusive use")
			ae.class, ae.method = classBasic, 20
			c.closeChannelFromShard(ch, ae)
		})
		for range size {
			step(frameBody, []byte{'b'})
		}
		wg.Wait()
		step(frameMethod, method2(classChannel, 41, nil)) // the client's close-ok
		if got := c.partial.Load(); got != 0 {
			t.Fatalf("round %d: %d bytes still counted as awaited after the channel's close", i, got)
		}
		c.mu.Lock()
		_, open := c.channels[1]
		c.mu.Unlock()
		if open {
			t.Fatalf("round %d: the channel is still open after its close-ok", i)
		}
		if ch.pubBuf.arena != nil {
			t.Fatalf("round %d: the closed channel still holds its unfinished message's buffer", i)
		}
		c.OnClose(nil, nil)
	}
}

// A channel keeps no view of a message it published: its pending publish
// kept the last message's buffer (up to the max message size) until the
// channel's next basic.publish, so an idle channel held a message its
// queues had let go of, which the memory alarm's count no longer saw.
func TestPublishedMessageNotHeldByChannel(t *testing.T) {
	srv, err := netio.Start(netio.Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Listen(srv, Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	c := newConn(l, netip.MustParseAddrPort("127.0.0.1:1"))
	c.user, c.channelMax = "guest", 2047
	c.opened.Store(true)
	c.state.Store(stOpen)
	defer c.OnClose(nil, nil)
	step := func(typ uint8, p []byte) {
		t.Helper()
		if err := c.handle(typ, 1, p); err != nil {
			t.Fatal(err)
		}
	}
	const size = 1 << 20
	hdr := binary.BigEndian.AppendUint16(nil, classBasic)
	hdr = append(hdr, 0, 0)
	hdr = binary.BigEndian.AppendUint64(hdr, size)
	hdr = append(hdr, 0, 0)
	step(frameMethod, method2(classChannel, 10, []byte{0}))
	step(frameMethod, method2(classBasic, 40, []byte{0, 0, 0, 1, 'q', 0}))
	step(frameHeader, hdr)
	body := make([]byte, 128<<10)
	for range size / len(body) {
		step(frameBody, body)
	}
	c.mu.Lock()
	ch := c.channels[1]
	c.mu.Unlock()
	if ch.pub != nil || ch.pubBuf.arena != nil || ch.pubBuf.in.props != nil {
		t.Fatalf("after the publish the channel still holds its message (%d bytes)", cap(ch.pubBuf.arena))
	}
}
