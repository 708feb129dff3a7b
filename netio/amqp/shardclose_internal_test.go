package amqp

import (
	"encoding/binary"
	"sync"
	"testing"
)

// contentHeader is a basic content header announcing size body bytes,
// with no properties.
func contentHeader(size uint64) []byte {
	hdr := binary.BigEndian.AppendUint16(nil, classBasic)
	hdr = append(hdr, 0, 0)
	hdr = binary.BigEndian.AppendUint64(hdr, size)
	return append(hdr, 0, 0)
}

// A shard closes a channel (a consume refused, say) while the loop reads
// a basic.publish's body on it. Only the loop touches the channel's
// pending publish: the shard's close cleared it, racing handle's look at
// it against onBody's use (a nil dereference on the event loop; under
// -race, a data race). The publish's share of the connection's unfinished
// bodies is let go at the channel's next frame.
func TestShardCloseDuringContent(t *testing.T) {
	l := raceListener(t)
	const size = 64
	for i := range raceRounds() {
		c, ch, step := raceConn(t, l)
		step(frameMethod, method2(classBasic, 40, []byte{0, 0, 0, 1, 'q', 0}))
		step(frameHeader, contentHeader(size))
		if got := c.partial.Load(); got != size {
			t.Fatalf("round %d: %d bytes awaited, want %d", i, got, size)
		}
		var wg sync.WaitGroup
		wg.Go(func() { shardClose(c, ch) })
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
	c, ch, step := raceConn(t, raceListener(t))
	defer c.OnClose(nil, nil)
	const size = 1 << 20
	step(frameMethod, method2(classBasic, 40, []byte{0, 0, 0, 1, 'q', 0}))
	step(frameHeader, contentHeader(size))
	body := make([]byte, 128<<10)
	for range size / len(body) {
		step(frameBody, body)
	}
	if ch.pub != nil || ch.pubBuf.arena != nil || ch.pubBuf.in.props != nil {
		t.Fatalf("after the publish the channel still holds its message (%d bytes)", cap(ch.pubBuf.arena))
	}
}
