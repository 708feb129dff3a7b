package cluster

// The handshake, both sides: the dialer's (handshake) and the listener's
// (accepted) proofs of the shared secret by HMAC challenge and response
// (mac), and the refusal frame (refuse).

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"net"
	"time"
)

// mac is HMAC-SHA256(secret) over the handshake: who speaks (label),
// both nonces and both node ids, so a proof cannot be replayed on another
// connection or reflected back.
func (t *Transport) mac(label string, nc, ns *[nonceSize]byte, dialer, to, listener uint64) []byte {
	h := hmac.New(sha256.New, t.cfg.Secret)
	h.Write([]byte(label))
	h.Write([]byte{version})
	h.Write(nc[:])
	h.Write(ns[:])
	var ids [24]byte
	binary.BigEndian.PutUint64(ids[:], dialer)
	binary.BigEndian.PutUint64(ids[8:], to)
	binary.BigEndian.PutUint64(ids[16:], listener)
	h.Write(ids[:])
	return h.Sum(nil)
}

func refuse(c net.Conn, reason string) {
	c.Write(appendFrame(nil, kindRefuse, []byte(reason)))
}

// handshake runs the dialer's side on conn (for lane l) to node id at
// addr (id 0: a call to whichever node listens there); it returns the
// listener's id.
func (t *Transport) handshake(conn net.Conn, id uint64, addr string, l byte) (uint64, error) {
	p := struct {
		id   uint64
		addr string
	}{id, addr}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	h := hello{version: version, from: t.cfg.NodeID, to: p.id, lane: l}
	rand.Read(h.nonce[:])
	if _, err := conn.Write(appendHello(nil, h)); err != nil {
		return 0, err
	}
	var buf []byte
	kind, pl, err := readFrame(conn, &buf, 4096)
	if err != nil {
		return 0, err
	}
	if kind == kindRefuse {
		// Not authenticated yet: whoever answers on p's address may say
		// anything. Only a refusal after the listener proved the secret
		// (below) may tell this node it was removed.
		return 0, fmt.Errorf("peer %d at %s refused this node: %s", p.id, p.addr, pl)
	}
	if kind != kindChall || len(pl) != 1+8+nonceSize+sha256.Size {
		return 0, fmt.Errorf("peer %d at %s: not a Warren cluster handshake", p.id, p.addr)
	}
	if pl[0] != version {
		return 0, fmt.Errorf("peer %d speaks cluster protocol version %d, this node %d: run the same Warren version on every node", p.id, pl[0], version)
	}
	from := binary.BigEndian.Uint64(pl[1:])
	if p.id == 0 {
		p.id = from
	} else if from != p.id {
		return 0, fmt.Errorf("%s is node %d, not node %d: check --peers", p.addr, from, p.id)
	}
	var ns [nonceSize]byte
	copy(ns[:], pl[9:])
	if !hmac.Equal(pl[9+nonceSize:], t.mac("listener", &h.nonce, &ns, t.cfg.NodeID, h.to, p.id)) {
		t.authFailures.Add(1)
		refuse(conn, "authentication failed: the cluster secrets differ")
		return 0, fmt.Errorf("peer %d at %s failed authentication: its cluster secret differs from this node's", p.id, p.addr)
	}
	if _, err := conn.Write(appendFrame(nil, kindProof, t.mac("dialer", &h.nonce, &ns, t.cfg.NodeID, h.to, p.id))); err != nil {
		return 0, err
	}
	kind, pl, err = readFrame(conn, &buf, 4096)
	if err != nil {
		return 0, err
	}
	if kind == kindRefuse {
		if bytes.Contains(pl, []byte(removedReason)) && t.cfg.OnRemoved != nil {
			t.cfg.OnRemoved(string(pl))
		}
		return 0, fmt.Errorf("peer %d at %s refused this node: %s", p.id, p.addr, pl)
	}
	if kind != kindOK {
		return 0, fmt.Errorf("peer %d at %s: unexpected frame kind %d in the handshake", p.id, p.addr, kind)
	}
	conn.SetDeadline(time.Time{})
	return p.id, nil
}

// accepted runs the handshake; it returns the authenticated peer's id,
// whether the connection is a call (Call: the hello named no node), and
// its lane.
func (t *Transport) accepted(c net.Conn) (uint64, bool, byte, error) {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	var buf []byte
	kind, pl, err := readFrame(c, &buf, 4096)
	if err != nil {
		t.refused.Add(1)
		return 0, false, 0, err
	}
	if kind != kindHello {
		t.refused.Add(1)
		refuse(c, "expected a hello")
		return 0, false, 0, fmt.Errorf("cluster: frame kind %d before the hello", kind)
	}
	h, err := parseHello(pl)
	if err == nil && h.to != t.cfg.NodeID && h.to != 0 {
		err = fmt.Errorf("cluster: this is node %d, not node %d: check --peers on node %d", t.cfg.NodeID, h.to, h.from)
	}
	t.pmu.RLock()
	known, gone := t.peers[h.from] != nil, t.gone[h.from]
	t.pmu.RUnlock()
	if err == nil && !known && !gone && h.to != 0 {
		err = fmt.Errorf("cluster: node %d is not a member of this node's cluster", h.from)
	}
	if err != nil {
		t.refused.Add(1)
		refuse(c, err.Error())
		return 0, false, 0, err
	}
	var ns [nonceSize]byte
	rand.Read(ns[:])
	p := make([]byte, 0, 1+8+nonceSize+sha256.Size)
	p = append(p, version)
	p = binary.BigEndian.AppendUint64(p, t.cfg.NodeID)
	p = append(p, ns[:]...)
	p = append(p, t.mac("listener", &h.nonce, &ns, h.from, h.to, t.cfg.NodeID)...)
	if _, err := c.Write(appendFrame(nil, kindChall, p)); err != nil {
		return 0, false, 0, err
	}
	kind, pl, err = readFrame(c, &buf, 4096)
	if err != nil {
		return 0, false, 0, err
	}
	if kind == kindRefuse {
		t.authFailures.Add(1)
		return 0, false, 0, fmt.Errorf("cluster: node %d refused this node: %s", h.from, pl)
	}
	if kind != kindProof || !hmac.Equal(pl, t.mac("dialer", &h.nonce, &ns, h.from, h.to, t.cfg.NodeID)) {
		t.authFailures.Add(1)
		refuse(c, "authentication failed: the cluster secrets differ")
		return 0, false, 0, fmt.Errorf("cluster: node %d failed authentication: its cluster secret differs from this node's", h.from)
	}
	if gone {
		// Told only once the dialer proved the secret, and so believed
		// (the dialer stops for good on it: OnRemoved).
		err := fmt.Errorf("cluster: node %d %s (node ids are never reused)", h.from, removedReason)
		t.refused.Add(1)
		refuse(c, err.Error())
		return 0, false, 0, err
	}
	if _, err := c.Write(appendFrame(nil, kindOK, nil)); err != nil {
		return 0, false, 0, err
	}
	c.SetDeadline(time.Time{})
	return h.from, h.to == 0, h.lane, nil
}
