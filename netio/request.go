package netio

import (
	"strconv"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/queue"
	"github.com/warren-mq/warren/wire"
)

// onRequest handles the request frames: topology, subscribe and cancel.
// Request-scoped failures come back as *requestErr (an ERROR reply).
func (c *conn) onRequest(ch *channel, body wire.Body) error {
	fail := func(req uint32, err error) error { return &requestErr{req: req, err: err} }
	switch r := body.(type) {
	case *wire.ExchangeDeclare:
		if err := c.srv.PermitDeclareIn(c.vhostName(), c.user, r.Passive, "exchange", r.Name, r.Alternate); err != nil {
			return fail(r.Req, err)
		}
		d := *r
		d.Name = c.qn(r.Name)
		if r.Alternate != "" {
			d.Alternate = c.qn(r.Alternate) // resolved in the vhost
		}
		if err := c.srv.DeclareExchangeAs(&d, c.user); err != nil {
			return fail(r.Req, c.local(err))
		}
		c.send(ch.id, &wire.OKReply{Req: r.Req})
	case *wire.ExchangeDelete:
		if err := c.srv.PermitIn(c.vhostName(), c.user, PermConfigure, "exchange", r.Name); err != nil {
			return fail(r.Req, err)
		}
		d := *r
		d.Name = c.qn(r.Name)
		if err := c.srv.DeleteExchangeAs(&d, c.requester()); err != nil {
			return fail(r.Req, c.local(err))
		}
		c.send(ch.id, &wire.OKReply{Req: r.Req})
	case *wire.QueueDeclare:
		if err := c.srv.PermitDeclareIn(c.vhostName(), c.user, r.Passive, "queue", r.Name, dlxOf(r.Args)); err != nil {
			return fail(r.Req, err)
		}
		d := *r
		d.Name = c.qn(r.Name) // "": a generated name in the vhost
		q, err := c.srv.DeclareQueueAs(&d, c.id, c.user)
		if err != nil {
			return fail(r.Req, c.local(err))
		}
		if r.Passive {
			// Answered by the queue's owner, after everything submitted
			// to it before: the counts are exact, and the settlements this
			// connection sent before it have taken effect (their dead
			// letters are in their targets' inboxes). Clients use it to
			// wait for that (warrenctl consume).
			ch.owed.Add(1) // paid by passiveDeclare.Answer
			c.srv.Submit(broker.Command{Kind: broker.CmdBarrier, Queue: q, Sink: passiveDeclare{c, q}, Req: reqRef(ch.id, r.Req)})
			return nil
		}
		c.send(ch.id, &wire.QueueDeclareOK{Req: r.Req, Name: broker.LocalName(q.Name()), Messages: uint64(q.ReadyCount()), Consumers: uint32(q.ConsumerCount())})
	case *wire.QueueDelete:
		q := c.srv.LookupQueue(c.qn(r.Name))
		if q == nil {
			return fail(r.Req, reqErr(wire.NotFound, "no queue %q", r.Name))
		}
		if q.ExclusiveTo() != 0 && q.ExclusiveTo() != c.id {
			return fail(r.Req, reqErr(wire.ResourceLocked, "queue %q is exclusive to another connection", r.Name))
		}
		if err := c.srv.PermitIn(c.vhostName(), c.user, PermConfigure, "queue", r.Name); err != nil {
			return fail(r.Req, err)
		}
		if err := c.srv.Authorize(c.user, ActDelete, q.DeclaredBy(), "queue "+strconv.Quote(r.Name)); err != nil {
			return fail(r.Req, err)
		}
		ch.owed.Add(1) // paid by Answer
		c.srv.Submit(broker.Command{Kind: broker.CmdDelete, Queue: q, Sink: c, Req: reqRef(ch.id, r.Req), Owner: c.id,
			IfUnused: r.IfUnused, IfEmpty: r.IfEmpty, Reason: "queue deleted"})
	case *wire.QueuePurge:
		q := c.srv.LookupQueue(c.qn(r.Name))
		if q == nil {
			return fail(r.Req, reqErr(wire.NotFound, "no queue %q", r.Name))
		}
		if q.ExclusiveTo() != 0 && q.ExclusiveTo() != c.id {
			return fail(r.Req, reqErr(wire.ResourceLocked, "queue %q is exclusive to another connection", r.Name))
		}
		if err := c.srv.PermitIn(c.vhostName(), c.user, PermRead, "queue", r.Name); err != nil {
			return fail(r.Req, err)
		}
		if err := c.srv.Authorize(c.user, ActPurge, q.DeclaredBy(), "queue "+strconv.Quote(r.Name)); err != nil {
			return fail(r.Req, err)
		}
		ch.owed.Add(1) // paid by Answer
		c.srv.Submit(broker.Command{Kind: broker.CmdPurge, Queue: q, Sink: c, Req: reqRef(ch.id, r.Req)})
	case *wire.Bind:
		if err := c.srv.PermitBindIn(c.vhostName(), c.user, r.Source, r.Destination, r.ToExchange); err != nil {
			return fail(r.Req, err)
		}
		d := *r
		d.Source, d.Destination = c.qn(r.Source), c.qn(r.Destination)
		if !r.ToExchange {
			if q := c.srv.LookupQueue(d.Destination); q != nil && q.ExclusiveTo() != 0 && q.ExclusiveTo() != c.id {
				return fail(r.Req, reqErr(wire.ResourceLocked, "queue %q is exclusive to another connection", r.Destination))
			}
		}
		if err := c.srv.BindAs(&d, c.requester()); err != nil {
			return fail(r.Req, c.local(err))
		}
		c.send(ch.id, &wire.OKReply{Req: r.Req})
	case *wire.Subscribe:
		return c.onSubscribe(ch, r)
	case *wire.Cancel:
		c.mu.Lock()
		cr := ch.consumers[r.ConsumerTag]
		delete(ch.consumers, r.ConsumerTag)
		if cr != nil {
			cr.cancelled = true
		}
		c.mu.Unlock()
		if cr == nil {
			return fail(r.Req, reqErr(wire.NotFound, "no consumer %q on this channel", r.ConsumerTag))
		}
		c.srv.Submit(broker.Command{Kind: broker.CmdCancel, Queue: cr.q, Consumer: cr.id})
		c.send(ch.id, &wire.OKReply{Req: r.Req})
	default:
		return errUnexpected(body.FrameType())
	}
	return nil
}

// reqRef is a connection's reference for a request it submits to a shard:
// the channel and the request id (Sink.Answer).
func reqRef(ch uint16, req uint32) uint64 { return uint64(ch)<<32 | uint64(req) }

// Answer replies to a request the connection submitted to a shard (Sink).
func (c *conn) Answer(ref uint64, r broker.Result) {
	ch, req := uint16(ref>>32), uint32(ref)
	if r.Code != wire.OK {
		c.sendError(ch, req, r.Code, c.localText(r.Reason))
	} else {
		c.send(ch, &wire.OKReply{Req: req, Count: uint64(r.N)})
	}
	c.mu.Lock()
	c.paidLocked(ch)
	c.mu.Unlock()
}

// passiveDeclare answers a passive QUEUE_DECLARE from the queue's shard
// (a Sink for one CmdBarrier): the shard has worked through everything
// submitted before it, and the queue's counts are the ones it stored after.
type passiveDeclare struct {
	*conn
	q *broker.Queue
}

// Answer runs on the queue's shard.
func (p passiveDeclare) Answer(ref uint64, _ broker.Result) {
	ch, req := uint16(ref>>32), uint32(ref)
	if p.q.Gone() {
		p.sendError(ch, req, wire.NotFound, "no queue "+strconv.Quote(broker.LocalName(p.q.Name())))
	} else {
		p.send(ch, &wire.QueueDeclareOK{Req: req, Name: broker.LocalName(p.q.Name()), Messages: uint64(p.q.ReadyCount()), Consumers: uint32(p.q.ConsumerCount())})
	}
	p.mu.Lock()
	p.paidLocked(ch)
	p.mu.Unlock()
}

// requester is who this connection is, for the topology's permission
// rule (Authorize's, for delete and unbind, as data): the user, whether it
// is an administrator, and the connection.
func (c *conn) requester() broker.Requester {
	return broker.Requester{User: c.user, Admin: c.srv.isAdmin(c.user), Conn: c.id}
}

func (c *conn) onSubscribe(ch *channel, r *wire.Subscribe) error {
	fail := func(err error) error { return &requestErr{req: r.Req, err: err} }
	args, err := wire.ParseSubscribeArgs(r.Args)
	if err != nil {
		return fail(err)
	}
	if err := c.srv.PermitIn(c.vhostName(), c.user, PermRead, "queue", r.Queue); err != nil {
		return fail(err)
	}
	q := c.srv.LookupQueue(c.qn(r.Queue))
	if q == nil {
		return fail(reqErr(wire.NotFound, "no queue %q", r.Queue))
	}
	if q.ExclusiveTo() != 0 && q.ExclusiveTo() != c.id {
		return fail(reqErr(wire.ResourceLocked, "queue %q is exclusive to another connection", r.Queue))
	}
	c.mu.Lock()
	if c.closed || ch.closed { // the socket went (onClose), or the channel closed, since the frame was read: dropped, as on a closed channel
		c.mu.Unlock()
		return nil
	}
	tag := r.ConsumerTag
	if tag == "" {
		ch.ctagSeq++
		tag = "ctag-" + strconv.FormatUint(c.id, 10) + "-" + strconv.Itoa(int(ch.id)) + "-" + strconv.Itoa(ch.ctagSeq)
	}
	if _, dup := ch.consumers[tag]; dup {
		c.mu.Unlock()
		return fail(reqErr(wire.PreconditionFailed, "consumer tag %q in use on this channel", tag))
	}
	if n := len(c.byID); n >= c.srv.cfg.MaxConsumersPerConnection {
		c.mu.Unlock()
		return fail(&wire.Error{Code: wire.LimitReached, Reason: c.srv.ConsumerLimitReason(n)})
	}
	prefetch := r.PrefetchCount
	if prefetch == 0 || prefetch > c.srv.cfg.MaxPrefetch {
		prefetch = c.srv.cfg.MaxPrefetch
	}
	cr := &consumerRef{
		id: c.srv.NewConsumerID(), tag: tag, tagBytes: []byte(tag),
		conn: c, ch: ch, q: q, autoAck: r.AutoAck,
	}
	if q.Args().ConsumerTimeout > 0 || args.ConsumerTimeout > 0 {
		cr.chTags = map[uint64]uint64{}
	}
	if ch.consumers == nil {
		ch.consumers = map[string]*consumerRef{}
	}
	ch.consumers[tag] = cr
	if len(ch.all) >= 2*len(c.byID)+16 {
		// Keep only the consumers their queues still have (c.byID): a
		// channel that subscribes and cancels in a loop holds its live
		// consumers, not every one it ever had (at most twice the
		// connection's, plus 16, each pass paid for by as many appends).
		live := ch.all[:0]
		for _, x := range ch.all {
			if c.byID[x.id] == x {
				live = append(live, x)
			}
		}
		clear(ch.all[len(live):])
		ch.all = live
	}
	ch.all = append(ch.all, cr)
	if c.byID == nil {
		c.byID = map[queue.ConsumerID]*consumerRef{}
	}
	c.byID[cr.id] = cr
	// Submitted under c.mu, as the channel was found open: onClose marks
	// the connection closed under it before it submits the connection's
	// Down, so the subscribe goes before the Down or not at all (after
	// it, the queue kept a consumer of a connection that is gone, and
	// what it handed it unacked).
	spec := queue.ConsumerSpec{ID: cr.id, Owner: queue.OwnerID(c.id), Prefetch: prefetch, PrefetchBytes: r.PrefetchBytes, Priority: r.Priority, Exclusive: r.Exclusive,
		TimeoutMs: args.ConsumerTimeout.Milliseconds()}
	c.srv.Submit(broker.Command{Kind: broker.CmdSubscribe, Queue: q, Sink: c, Spec: spec, Req: uint64(r.Req)})
	c.mu.Unlock()
	return nil
}

// onAuth checks credentials off the loop (password hashing is slow on
// purpose) and answers OPEN_OK or CLOSE auth_failed. EXTERNAL (a TLS
// client certificate) needs no password check.
func (c *conn) onAuth(f wire.Frame) error {
	body, err := wire.Decode(f, wire.HandshakeMaxFrame, nil)
	if err != nil {
		return err
	}
	a := body.(*wire.Auth)
	maxFrame := wire.Negotiate(c.srv.cfg.MaxFrame, a.MaxFrame)
	if maxFrame < wire.MinMaxFrame || maxFrame > wire.HardMaxFrame {
		return &wire.Error{Code: wire.FrameError, Reason: "max_frame out of range"}
	}
	switch a.Mechanism {
	case "PLAIN":
	case "EXTERNAL":
		return c.onExternal(a, maxFrame)
	default:
		c.srv.auth.refused("", c.remote.String(), "unsupported_mechanism")
		c.closeWith(wire.AuthFailed, "unsupported mechanism "+a.Mechanism)
		return nil
	}
	user, pass, ok := wire.ParsePlain(a.Response)
	if !ok {
		c.srv.auth.refused(user, c.remote.String(), "malformed_plain_response")
	}
	if !c.srv.credentialsSent(c) {
		// Closed meanwhile to admit a newer connection: its CLOSE is on
		// the way; read nothing more.
		c.state.Store(stClosing)
		return nil
	}
	c.state.Store(stAuthPending)
	go func() {
		if !ok || !c.srv.auth.check(user, pass, c.remote.String(), c.loopback) {
			c.srv.metrics.authFailures.Inc()
			c.closeWith(wire.AuthFailed, c.srv.auth.refusal(user, c.loopback))
			return
		}
		c.open(user, a, maxFrame)
	}()
	return nil
}

// onExternal authenticates with the TLS client certificate the front
// verified: the user is the one named by its subject CN, and must be a
// configured user (the built-in guest is not one). The response, if not
// empty, is an authorization identity that must equal the CN (RFC 4422
// appendix A). On the loop: there is no password to check.
func (c *conn) onExternal(a *wire.Auth, maxFrame uint32) error {
	cn := ""
	if c.tls != nil {
		cn = c.tls.certCN()
	}
	var reason, logReason string
	switch {
	case cn == "":
		logReason = "external_without_certificate"
		reason = "authentication failed: EXTERNAL needs a client certificate the broker verified (TLS port, tls_ca); use PLAIN"
	case len(a.Response) > 0 && string(a.Response) != cn:
		logReason = "external_identity_mismatch"
		reason = "authentication failed: the EXTERNAL response names another user than the certificate's CN " + strconv.Quote(cn)
	default:
		if _, ok := c.srv.auth.user(cn); !ok {
			logReason = "external_unknown_user"
			reason = "authentication failed: no user named " + strconv.Quote(cn) + " (the certificate's subject CN) is configured"
		}
	}
	if reason != "" {
		c.srv.auth.refused(cn, c.remote.String(), logReason)
		c.srv.metrics.authFailures.Inc()
		c.closeWith(wire.AuthFailed, reason)
		return nil
	}
	if !c.srv.credentialsSent(c) {
		c.state.Store(stClosing)
		return nil
	}
	c.state.Store(stAuthPending)
	c.open(cn, a, maxFrame)
	return nil
}

// open finishes an accepted AUTH: OPEN_OK with the negotiated limits,
// once the vhost it names admits the user (OpenVhost).
func (c *conn) open(user string, a *wire.Auth, maxFrame uint32) {
	vhost, err := c.srv.OpenVhost(a.Vhost, user)
	if err != nil {
		c.closeWith(wire.CodeOf(err), reasonOf(err))
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		c.srv.CloseVhost(vhost)
		return
	}
	c.vhost = vhost // onClose uncounts it
	c.mu.Unlock()
	c.user = user
	c.maxFrame = maxFrame
	c.maxChannels = wire.Negotiate(c.srv.cfg.MaxChannels, a.MaxChannels)
	hb := c.srv.cfg.HeartbeatMs
	if a.HeartbeatMs != 0 && (hb == 0 || a.HeartbeatMs < hb) {
		hb = a.HeartbeatMs
	}
	if floor := c.srv.minHeartbeatMs(); hb != 0 && hb < floor {
		// The tick sends heartbeats up to a tick late: below two ticks a
		// peer that judges us by 2×hb (as it must) would drop us.
		hb = floor
	}
	c.heartbeatMs.Store(hb)
	c.send(0, &wire.OpenOK{ConnectionID: c.id, MaxFrame: c.maxFrame, MaxChannels: c.maxChannels, HeartbeatMs: hb})
	c.opened.Store(true) // before it can own anything: its close must reach the shards
	if f := c.srv.beforeOpen.Load(); f != nil {
		(*f)(user)
	}
	if !c.state.CompareAndSwap(stAuthPending, stOpen) {
		return // closed meanwhile (handshake deadline, shutdown)
	}
	c.srv.authenticated(c)
	// The user or the vhost deleted while this connection was being
	// opened: the scan that closes their connections (closeUsers,
	// closeVhosts) skipped it, not open yet. That scan starts after the
	// tables are replaced, so if it ran before the line above, this lookup
	// sees the deletion.
	if !c.srv.Admitted(vhost, user) {
		c.closeWith(wire.ConnectionForced, "user "+strconv.Quote(user)+" or vhost "+strconv.Quote(vhost)+" was deleted while the connection opened")
		return
	}
	if c.srv.flowBlocked() {
		c.send(0, &wire.Flow{Active: false})
	}
	// Frames the client pipelined behind AUTH are waiting in the
	// inbound buffer: wake the loop to read them.
	_ = c.gc.Wake(nil)
}
