//go:build linux && !poll_opt

package netio

import (
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestLoopEpollFd: the field path conn.setReadInterest relies on leads to
// an epoll instance in the gnet version this module builds with.
func TestLoopEpollFd(t *testing.T) {
	s, err := Start(Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(t.Context()) })
	nc, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// HELLO comes back once the broker has opened the connection.
	if _, err := nc.Write(wire.Preamble[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Read(make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	s.connsMu.Lock()
	var c *conn
	for _, x := range s.conns {
		c = x
	}
	s.connsMu.Unlock()
	fd, err := loopEpollFd(c.gc)
	if err != nil {
		t.Fatal(err)
	}
	link, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil || link != "anon_inode:[eventpoll]" {
		t.Fatalf("fd %d is %q (%v), not an epoll instance", fd, link, err)
	}
}
