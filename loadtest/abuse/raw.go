package abuse

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/warren-mq/warren/wire"
)

// rawFrame is one frame read off a hand-driven socket.
type rawFrame struct {
	typ     wire.Type
	flags   uint8
	ch      uint16
	payload []byte
}

// body decodes a control frame; nil for batch frames and on error.
func (f rawFrame) body() wire.Body {
	b, err := wire.Decode(wire.Frame{Type: f.typ, Flags: f.flags, Channel: f.ch, Payload: f.payload}, wire.HardMaxFrame, nil)
	if err != nil {
		return nil
	}
	return b
}

// closeReason returns the code and reason of a CLOSE frame.
func (f rawFrame) closeReason() (string, bool) {
	if f.typ != wire.TypeClose {
		return "", false
	}
	if c, ok := f.body().(*wire.Close); ok {
		return fmt.Sprintf("%v: %s", c.Code, c.Reason), true
	}
	return "unparseable CLOSE", true
}

// readFrame reads one whole frame. payload is a fresh slice unless discard
// is set, in which case batch payloads are skipped without being kept.
func readFrame(r io.Reader, hdr []byte, discard bool) (rawFrame, error) {
	if _, err := io.ReadFull(r, hdr[:wire.HeaderSize]); err != nil {
		return rawFrame{}, err
	}
	n := binary.LittleEndian.Uint32(hdr)
	f := rawFrame{typ: wire.Type(hdr[4]), flags: hdr[5], ch: binary.LittleEndian.Uint16(hdr[6:])}
	if n > wire.HardMaxFrame {
		return f, fmt.Errorf("abuse: frame of %d bytes from the broker", n)
	}
	if discard && (f.typ == wire.TypeDeliver || f.typ == wire.TypeConfirm) {
		_, err := io.CopyN(io.Discard, r, int64(n))
		return f, err
	}
	f.payload = make([]byte, n)
	_, err := io.ReadFull(r, f.payload)
	return f, err
}

// dialer opens raw sockets; rcvBuf > 0 sets SO_RCVBUF before connecting, so
// the kernel's window stays small (a consumer that never reads).
func dialRaw(ctx context.Context, addr string, rcvBuf int) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second}
	if rcvBuf > 0 {
		d.Control = func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvBuf)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	return d.DialContext(ctx, "tcp", addr)
}

var errRefused = errors.New("refused")

// rawLogin does the handshake on nc by hand: preamble, HELLO, AUTH (PLAIN),
// then OPEN_OK. A CLOSE instead of OPEN_OK is errRefused wrapped with its
// reason.
func rawLogin(nc net.Conn, user, password string, heartbeatMs uint32) error {
	if _, err := nc.Write(wire.Preamble[:]); err != nil {
		return err
	}
	hdr := make([]byte, wire.HeaderSize)
	f, err := readFrame(nc, hdr, false)
	if err != nil {
		return fmt.Errorf("waiting for HELLO: %w", err)
	}
	if f.typ != wire.TypeHello {
		if r, ok := f.closeReason(); ok {
			return fmt.Errorf("%w before HELLO: %s", errRefused, r)
		}
		return fmt.Errorf("got %v, want HELLO", f.typ)
	}
	auth := wire.AppendFrame(nil, 0, &wire.Auth{Mechanism: "PLAIN", Response: wire.PlainResponse(user, password),
		Product: "warren-abuse", MaxFrame: wire.HardMaxFrame, HeartbeatMs: heartbeatMs})
	if _, err := nc.Write(auth); err != nil {
		return err
	}
	for {
		f, err = readFrame(nc, hdr, false)
		if err != nil {
			return fmt.Errorf("waiting for OPEN_OK: %w", err)
		}
		switch f.typ {
		case wire.TypeOpenOK:
			return nil
		case wire.TypeClose:
			r, _ := f.closeReason()
			return fmt.Errorf("%w: %s", errRefused, r)
		case wire.TypeAuthChallenge:
			return errors.New("unexpected AUTH_CHALLENGE for PLAIN")
		}
	}
}

// rawSession logs in and opens channel 1: the start of every hand-driven
// client that then misbehaves.
func rawSession(ctx context.Context, addr, user, password string, heartbeatMs uint32, rcvBuf int) (net.Conn, error) {
	nc, err := dialRaw(ctx, addr, rcvBuf)
	if err != nil {
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(15 * time.Second))
	if err := rawLogin(nc, user, password, heartbeatMs); err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := nc.Write(wire.AppendFrame(nil, 1, &wire.ChannelOpen{Req: 1})); err != nil {
		nc.Close()
		return nil, err
	}
	if _, err := expectReply(nc, 1); err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Time{})
	return nc, nil
}

// expectReply reads until the reply to request req (OK, ERROR or a
// declare's OK), skipping heartbeats and FLOW.
func expectReply(nc net.Conn, req uint32) (wire.Body, error) {
	hdr := make([]byte, wire.HeaderSize)
	for {
		f, err := readFrame(nc, hdr, true)
		if err != nil {
			return nil, err
		}
		switch b := f.body().(type) {
		case *wire.OKReply:
			if b.Req == req {
				return b, nil
			}
		case *wire.QueueDeclareOK:
			if b.Req == req {
				return b, nil
			}
		case *wire.ErrorReply:
			if b.Req == req {
				return b, fmt.Errorf("abuse: request %d: %v %s", req, b.Code, b.Message)
			}
		case *wire.Close:
			return b, fmt.Errorf("abuse: connection closed: %v %s", b.Code, b.Reason)
		case *wire.ChannelClose:
			return b, fmt.Errorf("abuse: channel closed: %v %s", b.Code, b.Reason)
		}
	}
}

// rawDeclareQueue declares name on channel 1 and waits for the answer.
func rawDeclareQueue(nc net.Conn, name string, req uint32, args wire.Table) error {
	if _, err := nc.Write(wire.AppendFrame(nil, 1, &wire.QueueDeclare{Req: req, Name: name, Args: args})); err != nil {
		return err
	}
	_, err := expectReply(nc, req)
	return err
}
