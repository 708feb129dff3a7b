package amqp

// Off-loop runs: the methods that can take time (declares, binds,
// consume, get, the handshake …) are handled on a goroutine while the
// event loop reads nothing more of the connection, so frames keep their
// order.

import (
	"encoding/binary"

	"github.com/panjf2000/gnet/v2"
)

// busyPauseBytes: past this many bytes buffered behind an off-loop run,
// the socket leaves the read interest until the run is done.
const busyPauseBytes = 1 << 20

// offLoopMax bounds the frames one off-loop run takes.
const offLoopMax = 256

// slowFrame: a frame handled off the loop. Methods on channels other than
// publish, ack, reject and nack can take time (a topology change waits for
// the metadata log; basic.get for the queue's shard); content, heartbeats
// and connection methods on channel 0 are cheap.
func slowFrame(typ uint8, chID uint16, p []byte) bool {
	if typ != frameMethod || chID == 0 || len(p) < 4 {
		return false
	}
	if binary.BigEndian.Uint16(p) != classBasic {
		return true
	}
	switch binary.BigEndian.Uint16(p[2:]) {
	case 40, 80, 90, 120:
		return false
	}
	return true
}

// startRun copies the run of complete slow frames at the head of the
// inbound buffer (at least one; during the handshake exactly one) and
// handles them on a goroutine; the loop reads nothing more of the
// connection until it is done. Loop goroutine.
func (c *conn) startRun(gc gnet.Conn, handshake bool) {
	var run []byte
	for k := 0; k < offLoopMax; k++ {
		hdr, err := gc.Peek(7)
		if err != nil {
			break
		}
		n := binary.BigEndian.Uint32(hdr[3:])
		size := int(n) + 8
		if uint64(size) > uint64(c.frameMax) || gc.InboundBuffered() < size {
			break
		}
		buf, err := gc.Peek(size)
		if err != nil || buf[size-1] != frameEnd {
			break
		}
		if k > 0 && (handshake || !slowFrame(buf[0], binary.BigEndian.Uint16(buf[1:]), buf[7:7+n])) {
			break // the loop deals with it when it goes on
		}
		if c.closeAhead && isClose(buf[0], binary.BigEndian.Uint16(buf[1:]), buf[7:7+n]) {
			c.closeAhead = false // reached (in this run): publishes wait at the bound again
		}
		run = append(run, buf...)
		_, _ = gc.Discard(size)
	}
	c.busy.Store(true)
	go c.runOff(gc, run, handshake)
}

// runOff handles a run of frames as the loop would have, then wakes the
// loop to read on.
func (c *conn) runOff(gc gnet.Conn, run []byte, handshake bool) {
	defer func() {
		c.busy.Store(false)
		_ = gc.Wake(nil)
	}()
	for len(run) > 0 && c.state.Load() != stClosing {
		typ, chID := run[0], binary.BigEndian.Uint16(run[1:])
		n := int(binary.BigEndian.Uint32(run[3:]))
		p := run[7 : 7+n]
		run = run[n+8:]
		var err error
		if handshake {
			err = c.handshakeStep(typ, chID, p)
		} else {
			err = c.handle(typ, chID, p)
		}
		if err != nil {
			c.fail(err)
			return
		}
	}
}
