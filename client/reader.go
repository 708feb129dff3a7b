package client

import (
	"fmt"
	"time"

	"github.com/warren-mq/warren/wire"
)

// reader reads frames and dispatches them until the connection ends.
func (c *Conn) reader() {
	// base is the read buffer; buf, the unread bytes, is a window of it.
	// Frames are handled in place and nothing keeps a slice of them past
	// dispatch (the copying API copies, wire.Decode owns its results,
	// ConsumeBatch bodies are valid only while its handler runs), so the
	// unread tail moves back to the start and base is reused rather than
	// replaced.
	base := make([]byte, 0, 256<<10)
	buf := base
	var dec wire.Decompressor
	for {
		f, n, err := wire.Split(buf, c.maxFrame)
		if err != nil {
			c.shutdown(err)
			return
		}
		if n == 0 {
			// Need more bytes: make room (compact, grow) and read.
			need := wire.FrameSize(buf)
			if cap(buf)-len(buf) < 4096 || need > cap(buf) {
				buf = base[:copy(base[:len(buf)], buf)]
				if need > cap(base) || cap(base)-len(buf) < 4096 {
					nb := make([]byte, len(buf), max(need, 2*cap(base)))
					copy(nb, buf)
					base, buf = nb[:0], nb
				}
			}
			m, err := c.nc.Read(buf[len(buf):cap(buf)])
			if err != nil {
				c.shutdown(fmt.Errorf("client: read: %w", err))
				return
			}
			buf = buf[:len(buf)+m]
			c.lastRecv.Store(time.Now().UnixNano())
			continue
		}
		if err := c.dispatch(f, &dec); err != nil {
			c.shutdown(err)
			return
		}
		buf = buf[n:]
		if len(buf) == 0 {
			buf = base[:0]
		}
	}
}

func (c *Conn) channel(id uint16) *Channel {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.channels[id]
}

func (c *Conn) dispatch(f wire.Frame, dec *wire.Decompressor) error {
	switch f.Type {
	case wire.TypeHeartbeat:
		return nil
	case wire.TypeFlow:
		body, err := wire.Decode(f, c.maxFrame, nil)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.flowOn = body.(*wire.Flow).Active
		c.flowCond.Broadcast()
		c.mu.Unlock()
		return nil
	case wire.TypeClose:
		body, err := wire.Decode(f, c.maxFrame, nil)
		if err != nil {
			return err
		}
		cl := body.(*wire.Close)
		c.wmu.Lock()
		c.wbuf = wire.AppendFrame(c.wbuf, 0, &wire.CloseOK{})
		c.closing = true
		c.wcond.Broadcast()
		c.wmu.Unlock()
		if cl.Code == wire.OK {
			return ErrClosed
		}
		return &wire.Error{Code: cl.Code, Reason: cl.Reason}
	case wire.TypeCloseOK:
		return ErrClosed
	}
	ch := c.channel(f.Channel)
	if ch == nil {
		return nil // a channel we closed; its frames are dropped
	}
	switch f.Type {
	case wire.TypeConfirm:
		var b wire.ConfirmBatch
		if err := wire.DecodeConfirm(f, &b); err != nil {
			return err
		}
		for i := 0; i < b.Count; i++ {
			var r wire.ConfirmRange
			b.At(i, &r)
			ch.onConfirm(r)
		}
	case wire.TypeDeliver:
		var b wire.DeliverBatch
		if err := wire.DecodeDeliver(f, c.maxFrame, dec, &b); err != nil {
			return err
		}
		ch.mu.Lock()
		cs := ch.consumers[string(b.ConsumerTag)]
		ch.mu.Unlock()
		if cs == nil {
			return nil // cancelled; the broker takes unacked ones back on close
		}
		if cs.batch != nil {
			cs.deliverBatch(ch, b.Deliveries())
			return nil
		}
		cs.deliverCopies(ch, b.Deliveries())
	case wire.TypeReturn:
		var b wire.ReturnBatch
		if err := wire.DecodeReturn(f, &b); err != nil {
			return err
		}
		ch.mu.Lock()
		fn := ch.returnFn
		ch.mu.Unlock()
		if fn == nil {
			return nil
		}
		it := b.Returns()
		var rm wire.Returned
		for it.Next(&rm) {
			// DecodeProps copies (headers included), so the Return owns
			// its properties and does not pin buf. DecodeReturn has
			// validated the block: it cannot fail here.
			props, _ := wire.DecodeProps(rm.Message.Properties)
			fn(Return{Seq: rm.Seq, Code: rm.Code, Exchange: string(rm.Exchange), Message: Message{
				RoutingKey: string(rm.Message.RoutingKey), Body: append([]byte(nil), rm.Message.Body...),
				Mandatory: rm.Message.Flags&wire.Mandatory != 0, Persistent: rm.Message.Flags&wire.Persistent != 0,
				Priority: rm.Message.Priority, Props: props,
			}})
		}
	case wire.TypeOK, wire.TypeError, wire.TypeQueueDeclareOK, wire.TypeSubscribeOK:
		body, err := wire.Decode(f, c.maxFrame, nil)
		if err != nil {
			return err
		}
		var req uint32
		switch b := body.(type) {
		case *wire.OKReply:
			req = b.Req
		case *wire.ErrorReply:
			req = b.Req
		case *wire.QueueDeclareOK:
			req = b.Req
		case *wire.SubscribeOK:
			req = b.Req
		}
		ch.mu.Lock()
		cl := ch.pending[req]
		delete(ch.pending, req)
		ch.mu.Unlock()
		if cl != nil {
			if cl.onReply != nil {
				cl.onReply(body)
			}
			cl.reply <- body
		}
	case wire.TypeCancelled:
		body, err := wire.Decode(f, c.maxFrame, nil)
		if err != nil {
			return err
		}
		cn := body.(*wire.Cancelled)
		ch.mu.Lock()
		cs := ch.consumers[cn.ConsumerTag]
		delete(ch.consumers, cn.ConsumerTag)
		ch.mu.Unlock()
		if cs != nil {
			cs.stop(&wire.Error{Code: cn.Code, Reason: cn.Reason})
		}
	case wire.TypeLeaseExpired:
		body, err := wire.Decode(f, c.maxFrame, nil)
		if err != nil {
			return err
		}
		le := body.(*wire.LeaseExpired)
		ch.mu.Lock()
		cs := ch.consumers[le.ConsumerTag]
		ch.mu.Unlock()
		if cs != nil {
			cs.mu.Lock()
			fn := cs.expired
			cs.mu.Unlock()
			if fn != nil {
				fn(le.Tags)
			}
		}
	case wire.TypeChannelClose:
		body, err := wire.Decode(f, c.maxFrame, nil)
		if err != nil {
			return err
		}
		cc := body.(*wire.ChannelClose)
		_ = c.sendFrame(ch.id, &wire.ChannelCloseOK{})
		c.mu.Lock()
		delete(c.channels, ch.id)
		c.mu.Unlock()
		ch.fail(&wire.Error{Code: cc.Code, Reason: cc.Reason})
	case wire.TypeChannelCloseOK:
		c.mu.Lock()
		delete(c.channels, ch.id)
		c.mu.Unlock()
	}
	return nil
}
