package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"
)

// Calls: one request and its answer on a connection of their own, for
// what is not raft traffic (a node asking to join, a membership change
// forwarded to the metadata leader). The dialer's hello names node 0
// ("whichever node listens here"), the handshake proves the secret as
// for peers, then:
//
//	dialer → kindCall:  op u8 | body
//	listener → kindReply: status u8 (0: ok, 1: error) | the answer, or the error's text
//
// and the connection closes. The caller need not be a peer (a node that
// joins is not one yet); a node removed from the cluster is refused.

// callTimeout bounds a call whose context has no deadline.
const callTimeout = 30 * time.Second

// removedReason is in the refusal a removed node gets (OnRemoved).
const removedReason = "was removed from the cluster"

// MaxCallBytes bounds a call's body and its answer.
const MaxCallBytes = 1 << 20

// CallError is an error the called node returned (its text).
type CallError struct {
	Node uint64
	Msg  string
}

func (e *CallError) Error() string { return e.Msg }

// Call asks whichever node listens on addr (its cluster port) to handle
// op with body (Config.Handle there) and returns its answer; an error the
// handler returned is a *CallError. It returns the answering node's id.
func (t *Transport) Call(ctx context.Context, addr string, op byte, body []byte) (uint64, []byte, error) {
	return t.call(ctx, 0, addr, op, body)
}

// CallNode is Call to peer id.
func (t *Transport) CallNode(ctx context.Context, id uint64, op byte, body []byte) ([]byte, error) {
	p := t.peer(id)
	if p == nil {
		return nil, fmt.Errorf("cluster: node %d is not a known peer", id)
	}
	_, b, err := t.call(ctx, id, p.addr, op, body)
	return b, err
}

func (t *Transport) call(ctx context.Context, id uint64, addr string, op byte, body []byte) (uint64, []byte, error) {
	if len(body)+2 > MaxCallBytes {
		return 0, nil, fmt.Errorf("cluster: a call of %d bytes, over the %d-byte limit", len(body), MaxCallBytes)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, callTimeout)
		defer cancel()
	}
	d := net.Dialer{Timeout: handshakeTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	// The hello names node 0 so the listener takes it as a call even
	// from a peer.
	from, err := t.handshake(conn, 0, addr, laneControl)
	if err != nil {
		return 0, nil, err
	}
	if id != 0 && from != id {
		return 0, nil, fmt.Errorf("cluster: %s is node %d, not node %d", addr, from, id)
	}
	dl, _ := ctx.Deadline()
	conn.SetDeadline(dl)
	if _, err := conn.Write(appendFrame(nil, kindCall, append([]byte{op}, body...))); err != nil {
		return from, nil, err
	}
	var buf []byte
	kind, pl, err := readFrame(conn, &buf, MaxCallBytes)
	if err != nil {
		if ctx.Err() != nil {
			return from, nil, fmt.Errorf("cluster: node %d did not answer: %w", from, ctx.Err())
		}
		return from, nil, err
	}
	if kind == kindRefuse {
		return from, nil, fmt.Errorf("cluster: node %d refused the call: %s", from, pl)
	}
	if kind != kindReply || len(pl) == 0 {
		return from, nil, fmt.Errorf("cluster: node %d answered a call with a frame of kind %d", from, kind)
	}
	if pl[0] != 0 {
		return from, nil, &CallError{Node: from, Msg: string(pl[1:])}
	}
	return from, append([]byte(nil), pl[1:]...), nil
}

// serveCall reads one call on c from node from, answers it, and returns
// (the connection closes).
func (t *Transport) serveCall(c net.Conn, from uint64) {
	c.SetDeadline(time.Now().Add(callTimeout))
	var buf []byte
	kind, pl, err := readFrame(c, &buf, MaxCallBytes)
	if err != nil {
		return
	}
	if kind != kindCall || len(pl) == 0 {
		refuse(c, "expected a call")
		return
	}
	if t.cfg.Handle == nil {
		refuse(c, "this node takes no calls")
		return
	}
	ans, err := t.cfg.Handle(from, pl[0], pl[1:])
	var reply []byte
	switch {
	case err != nil:
		reply = append([]byte{1}, err.Error()...)
	case len(ans)+1 > MaxCallBytes:
		reply = append([]byte{1}, "the answer is over the call limit"...)
	default:
		reply = append([]byte{0}, ans...)
	}
	if _, err := c.Write(appendFrame(nil, kindReply, reply)); err != nil && !errors.Is(err, net.ErrClosed) {
		t.log.Debug("cluster: a call's answer not written", "from", from, "err", err)
	}
}
