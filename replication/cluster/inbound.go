package cluster

// Inbound connections: the accept loop (at most maxHandshakes not yet
// authenticated) and each connection's reader (serve), which hands raft
// messages, snapshots and forwards to the Config's Deliver functions.

import (
	"errors"
	"fmt"
	"io"
	"net"

	"go.etcd.io/raft/v3/raftpb"
)

func (t *Transport) accept() {
	defer t.wg.Done()
	for {
		c, err := t.ln.Accept()
		if err != nil {
			select {
			case <-t.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			t.log.Error("cluster: accept failed; the cluster listener stops", "err", err)
			return
		}
		select {
		case t.hs <- struct{}{}:
		default:
			t.refused.Add(1)
			c.Close()
			continue
		}
		t.mu.Lock()
		select {
		case <-t.closed:
			t.mu.Unlock()
			c.Close()
			return
		default:
		}
		t.conns[c] = struct{}{}
		t.mu.Unlock()
		t.wg.Add(1)
		go t.serve(c)
	}
}

// serve runs the listener's side of the handshake on c, then reads its
// raft frames.
func (t *Transport) serve(c net.Conn) {
	defer t.wg.Done()
	defer func() {
		c.Close()
		t.mu.Lock()
		delete(t.conns, c)
		t.mu.Unlock()
	}()
	from, call, l, err := t.accepted(c)
	<-t.hs
	if err != nil {
		t.log.Warn("cluster: refused a connection", "remote", c.RemoteAddr(), "err", err)
		return
	}
	if call {
		t.serveCall(c, from)
		return
	}
	key := inboundKey{from, l}
	t.mu.Lock()
	if old := t.inbound[key]; old != nil {
		old.Close() // the peer reconnected: one inbound connection per peer and lane
	}
	t.inbound[key] = c
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		if t.inbound[key] == c {
			delete(t.inbound, key)
		}
		t.mu.Unlock()
	}()
	var buf []byte
	var snap *spool                            // a snapshot being received
	defer func() { t.dropSpool(from, snap) }() // partial: never delivered
	for {
		kind, pl, err := readFrame(c, &buf, t.cfg.MaxFrameBytes)
		if err == nil && kind != kindRaft && kind != kindSnap && kind != kindFwd {
			err = fmt.Errorf("cluster: a frame of kind %d after the handshake", kind)
		}
		if err == nil && kind == kindSnap {
			err = t.snapFrame(from, pl, &snap)
		} else if err == nil && kind == kindFwd { // (between a snapshot's frames too)
			t.received.Add(1)
			if t.cfg.DeliverForward != nil {
				t.cfg.DeliverForward(from, pl)
			}
		} else if err == nil && snap != nil {
			err = errors.New("cluster: a raft frame inside a snapshot's frames")
		} else if err == nil {
			err = eachMessage(pl, func(gid uint64, b []byte) error {
				var m raftpb.Message
				if err := m.Unmarshal(b); err != nil {
					return fmt.Errorf("cluster: a raft message that does not decode: %w", err)
				}
				if m.From != from {
					return fmt.Errorf("cluster: node %d sent a message from node %d", from, m.From)
				}
				t.received.Add(1)
				t.cfg.Deliver(gid, m)
				return nil
			})
		}
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				select {
				case <-t.closed:
				default:
					t.refused.Add(1)
					t.log.Warn("cluster: closing a peer's connection", "peer", from, "err", err)
				}
			}
			return
		}
		if cap(buf) > 1<<20 {
			buf = nil
		}
	}
}
