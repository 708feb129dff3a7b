//go:build !linux || poll_opt

package netio

import (
	"errors"

	"github.com/panjf2000/gnet/v2"
)

// Without gnet's default Linux poller the broker cannot take a socket out
// of its loop's read interest: a blocked connection's frames then wait in
// gnet's inbound buffer, which is capped (conn.blockedInboundCap), and so
// are the frames a client pipelines behind a control run (conn.gateCtlRead).
func (c *conn) setReadInterest(bool) error {
	return errors.New("netio: pausing reads needs gnet's default Linux poller")
}

// Set cannot pause reading here either.
func (g *ReadGate) Set(gnet.Conn, bool) error {
	return errors.New("netio: pausing reads needs gnet's default Linux poller")
}
