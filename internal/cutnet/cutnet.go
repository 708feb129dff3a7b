// Package cutnet is a listener for tests whose connections are lost part
// way through a transfer: the first connection to read past a number of
// counted bytes is closed there, as a network that drops it would.
package cutnet

import (
	"net"
	"sync/atomic"
)

// Listener hands out connections of which the first to read past
// CutAfter counted bytes is closed there (its Read answers
// net.ErrClosed); the others are left alone. Count, when set, is called
// once per connection for a counter that says how many bytes of each
// read count (only a snapshot frame's payload, say); unset, every byte
// read counts. Set Count before the first Accept.
type Listener struct {
	net.Listener
	CutAfter atomic.Int64
	Count    func() func(read []byte) int64
	cut      atomic.Bool
}

// Cut reports whether a connection was cut.
func (l *Listener) Cut() bool { return l.cut.Load() }

// Accept wraps the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &conn{Conn: c, l: l}
	if l.Count != nil {
		cc.count = l.Count()
	}
	return cc, nil
}

type conn struct {
	net.Conn
	l       *Listener
	count   func([]byte) int64
	counted int64
}

func (c *conn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.count != nil {
		c.counted += c.count(b[:n])
	} else {
		c.counted += int64(n)
	}
	if c.counted > c.l.CutAfter.Load() && c.l.cut.CompareAndSwap(false, true) {
		c.Conn.Close()
		return 0, net.ErrClosed
	}
	return n, err
}
