//go:build linux && !poll_opt

package netio

import (
	"errors"
	"reflect"

	"github.com/panjf2000/gnet/v2"
	"golang.org/x/sys/unix"
)

// gnet has no call to stop reading one connection: its loop reads every
// readable socket and keeps what OnTraffic leaves in an unbounded inbound
// buffer, so leaving bytes unread would only move the client's flood from
// the kernel into the broker's heap. To push back on a client with TCP
// itself, a blocked connection's socket is taken out of its loop's epoll
// read interest (EPOLL_CTL_MOD on the loop's own epoll instance): the
// kernel's receive buffer fills, the advertised window closes, and the
// client's writes stop. EPOLLERR and EPOLLHUP are always reported, so a
// peer that resets is still noticed.
//
// This relies on two facts of gnet v2's default (non poll_opt) Linux
// poller, checked by TestLoopEpollFd and TestFlowIgnoringPublisherIsBlocked: the loop's epoll fd is the
// field loop.poller.fd of the connection, and events carry the socket's fd
// as their data. gnet re-arms read interest itself when a pending write
// drains (ModRead) or a write has to wait (ModReadWrite); the broker takes
// it back in OnTraffic and in the write callback (see conn.block).

var errNoPoller = errors.New("netio: cannot find the event loop's epoll instance")

// loopEpollFd finds the epoll fd of the loop that owns gc.
func loopEpollFd(gc gnet.Conn) (int, error) {
	v := reflect.ValueOf(gc)
	for _, name := range []string{"loop", "poller", "fd"} {
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return -1, errNoPoller
		}
		v = v.Elem().FieldByName(name)
		if !v.IsValid() {
			return -1, errNoPoller
		}
	}
	if v.Kind() != reflect.Int {
		return -1, errNoPoller
	}
	return int(v.Int()), nil
}

// setReadInterest turns reading of c's socket on or off, keeping write
// interest while gnet has bytes waiting to go out. Loop goroutine only:
// gnet changes the same registration from there.
func (c *conn) setReadInterest(read bool) error { return setReadInterest(c.gc, &c.epfd, read) }

// Set turns reading of gc's socket on or off (another front's connection,
// served by the same loops: netio/amqp). Loop goroutine only.
func (g *ReadGate) Set(gc gnet.Conn, read bool) error { return setReadInterest(gc, &g.epfd, read) }

// setReadInterest: epfd caches the loop's epoll fd (0: not looked up yet,
// -1: unavailable).
func setReadInterest(gc gnet.Conn, epfd *int, read bool) error {
	if *epfd < 0 {
		return errNoPoller
	}
	if *epfd == 0 {
		fd, err := loopEpollFd(gc)
		if err != nil {
			*epfd = -1
			return err
		}
		*epfd = fd
	}
	var ev uint32
	if read {
		ev = unix.EPOLLIN | unix.EPOLLPRI
	}
	if gc.OutboundBuffered() > 0 {
		ev |= unix.EPOLLOUT
	}
	fd := gc.Fd()
	return unix.EpollCtl(*epfd, unix.EPOLL_CTL_MOD, fd, &unix.EpollEvent{Fd: int32(fd), Events: ev})
}
