package amqp

// The handshake (off the loop, one method a run): connection.start sent,
// start-ok (the credentials), tune-ok and open taken (handshakeStep), and
// a PROXY protocol header read before the protocol header (proxyStep, on
// the loop).

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strconv"
	"time"

	"github.com/panjf2000/gnet/v2"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/wire"
)

// sendStart sends connection.start. Loop goroutine.
func (c *conn) sendStart() {
	c.mu.Lock()
	b, st := method(c.out, 0, classConnection, 10)
	b = append(b, 0, 9)
	b = putTable(b, wire.Table{
		{Key: "product", Value: wire.String("Warren")},
		{Key: "version", Value: wire.String(netio.Version)},
		{Key: "platform", Value: wire.String("Go")},
		{Key: "capabilities", Value: wire.TableValue(wire.Table{
			{Key: "publisher_confirms", Value: wire.Bool(true)},
			{Key: "basic.nack", Value: wire.Bool(true)},
			{Key: "consumer_cancel_notify", Value: wire.Bool(true)},
			{Key: "exchange_exchange_bindings", Value: wire.Bool(true)},
			{Key: "per_consumer_qos", Value: wire.Bool(true)},
			{Key: "connection.blocked", Value: wire.Bool(true)},
			{Key: "consumer_priorities", Value: wire.Bool(true)},
			{Key: "authentication_failure_close", Value: wire.Bool(true)},
			{Key: "direct_reply_to", Value: wire.Bool(true)},
		})},
	})
	b = putLongstr(b, []byte("PLAIN AMQPLAIN"))
	b = putLongstr(b, []byte("en_US"))
	c.out = endFrame(b, st)
	c.flushLocked()
	c.mu.Unlock()
}

// handshakeStep handles one frame of the handshake (off the loop): the
// method expected at step c.hs.
func (c *conn) handshakeStep(typ uint8, ch uint16, p []byte) error {
	if typ == frameHeartbeat {
		return nil
	}
	if typ != frameMethod || ch != 0 || len(p) < 4 {
		return connErr(unexpectedFrame, "UNEXPECTED_FRAME - expected a connection method during the handshake")
	}
	cl, m := binary.BigEndian.Uint16(p), binary.BigEndian.Uint16(p[2:])
	c.curClass, c.curMethod = cl, m
	if cl == classConnection && m == 50 { // close during the handshake
		c.sendCloseOK()
		return errClientClosed
	}
	want := [...]uint16{hsStartOK: 11, hsTuneOK: 31, hsOpen: 40}[c.hs]
	if cl != classConnection || m != want {
		return connErr(commandInvalid, "COMMAND_INVALID - expected connection method "+strconv.Itoa(int(want))+" during the handshake")
	}
	r := &reader{b: p[4:]}
	switch c.hs {
	case hsStartOK:
		return c.onStartOK(r)
	case hsTuneOK:
		return c.onTuneOK(r)
	}
	return c.onOpen(r)
}

func (c *conn) onStartOK(r *reader) error {
	if !c.l.credentialsSent(c) {
		return errEvicted
	}
	props := r.table() // client properties
	if v, ok := props.Get("capabilities"); ok && v.Kind == wire.KindTable {
		if b, ok := v.Table.Get("connection.blocked"); ok && b.Kind == wire.KindBool && b.Int == 1 {
			c.blockedCap = true
		}
	}
	mech := r.shortstr()
	resp := r.longstr()
	r.shortstr() // locale
	if r.err != nil {
		return r.err
	}
	var user, pass string
	ok := false
	switch mech {
	case "PLAIN":
		parts := bytes.SplitN(resp, []byte{0}, 3)
		if len(parts) == 3 {
			user, pass, ok = string(parts[1]), string(parts[2]), true
		}
	case "AMQPLAIN":
		if t, err := parseTable(resp, 0); err == nil {
			l, _ := t.Get("LOGIN")
			p, _ := t.Get("PASSWORD")
			user, pass, ok = string(l.Bytes), string(p.Bytes), true
		}
	default:
		return connErr(accessRefused, "ACCESS_REFUSED - unsupported mechanism "+strconv.Quote(mech)+": use PLAIN or AMQPLAIN")
	}
	if !ok {
		return connErr(accessRefused, "ACCESS_REFUSED - malformed "+mech+" response")
	}
	tags, authed := c.srv.Authenticate(user, pass, c.remote)
	if !authed {
		return connErr(accessRefused, "ACCESS_REFUSED - "+c.srv.AuthRefusal(user, c.remote))
	}
	c.user = user
	for _, t := range tags {
		if t == "administrator" {
			c.admin = true
		}
	}
	if c.state.Load() == stClosing {
		return nil
	}
	c.hs = hsTuneOK
	c.reply(0, classConnection, 30, func(b []byte) []byte {
		b = binary.BigEndian.AppendUint16(b, c.l.cfg.ChannelMax)
		b = binary.BigEndian.AppendUint32(b, c.l.cfg.FrameMax)
		return binary.BigEndian.AppendUint16(b, c.l.cfg.Heartbeat)
	})
	return nil
}

func (c *conn) onTuneOK(r *reader) error {
	chMax, fMax, hb := r.u16(), r.u32(), r.u16()
	if r.err != nil {
		return r.err
	}
	c.channelMax = c.l.cfg.ChannelMax
	if chMax != 0 && chMax < c.channelMax {
		c.channelMax = chMax
	}
	if fMax != 0 && fMax < frameMinSize {
		return connErr(frameError, "FRAME_ERROR - frame-max "+strconv.Itoa(int(fMax))+" is below the least, 4096")
	}
	if fMax != 0 && fMax < c.frameMax {
		c.frameMax = fMax
	}
	if hb != 0 {
		c.heartbeat = time.Duration(hb) * time.Second
	}
	c.hs = hsOpen
	return nil
}

func (c *conn) onOpen(r *reader) error {
	vhost := r.shortstr()
	if r.err != nil {
		return r.err
	}
	v, err := c.srv.OpenVhost(vhost, c.user)
	if err != nil {
		return connErr(notAllowed, "NOT_ALLOWED - "+errText(err))
	}
	if !c.l.setVhost(c, v) {
		return nil // closed meanwhile
	}
	if f := c.l.beforeOpen.Load(); f != nil {
		(*f)(c.user)
	}
	c.opened.Store(true)
	// The user or the vhost deleted while this connection was being
	// opened: the scan closing their connections (followDeletes) skipped
	// it, not open yet. That scan starts after the tables are replaced, so
	// if it ran before the line above, this lookup sees the deletion.
	if !c.srv.Admitted(v, c.user) {
		return connErr(connectionForced, "CONNECTION_FORCED - user '"+c.user+"' or vhost '"+v+"' was deleted while the connection opened")
	}
	c.lastRecv.Store(time.Now().UnixMilli())
	if !c.state.CompareAndSwap(stHandshake, stOpen) {
		return nil // closed meanwhile (the handshake deadline)
	}
	c.l.opened(c)
	c.reply(0, classConnection, 41, func(b []byte) []byte { return putShortstr(b, "") })
	return nil
}

// proxyStep reads a PROXY protocol header before the protocol header (the
// PROXY protocol is on). It reports whether the protocol header may be
// read now; false: wait for more bytes, or the connection was refused.
// Loop goroutine.
func (c *conn) proxyStep(gc gnet.Conn) bool {
	n := gc.InboundBuffered()
	if n == 0 {
		return false
	}
	b, err := gc.Peek(n)
	if err != nil {
		return false
	}
	isProxy, hlen, src, err := netio.ParseProxyHeader(b)
	if isProxy && hlen == 0 && err == nil {
		return false // the rest of it (the handshake deadline bounds the wait)
	}
	if !c.viaProxy {
		if isProxy {
			// Only a trusted proxy may say where a client comes from, or
			// any client could claim to be 127.0.0.1.
			c.l.met.refusedProxy.Inc()
			c.l.log.Warn("AMQP: PROXY header from an untrusted address: refused", "conn", c.id, "remote", c.remote)
			c.closeNow()
			return false
		}
		c.proxyDone = true
		return true
	}
	if err != nil {
		c.l.log.Warn("AMQP: malformed PROXY header: refused", "conn", c.id, "remote", c.remote, "err", err)
		c.closeNow()
		return false
	}
	if hlen > 0 { // none: a trusted peer may also connect directly (Discard(0) would drop everything)
		_, _ = gc.Discard(hlen)
	}
	if src.IsValid() {
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		c.src, c.remote = src, src.String()
	}
	c.proxyDone = true
	// The per-source cap counts the client's address, known only now.
	c.refusal = c.l.admitSource(c)
	return true
}
