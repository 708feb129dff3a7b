package netio

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/internal/ratelog"
	"github.com/warren-mq/warren/wire"
)

// Virtual hosts at run time (issue 15): which vhosts exist and their
// limits (told by the broker, broker.OnVhosts), how many connections each
// holds, the access check when a connection opens one, closing the
// connections of a deleted vhost, and the audit of permission refusals.
// The names a connection gives are qualified with its vhost before they
// reach the broker (broker.QualifyName) and stripped from what it is
// answered (broker.LocalName, broker.LocalText).

type vhostState struct {
	recs atomic.Pointer[map[string]broker.MetaVhost]
	mu   sync.Mutex
	n    map[string]int // open connections by vhost, every front (mu)
	// vhostDeleted: the other fronts' functions told of a deleted vhost.
	deleted []func(vhost string) // (mu)

	permRefusals *metrics.Counter
	refusedMu    sync.Mutex
	refusedLog   ratelog.Limiter
}

// initVhosts follows the broker's vhosts and registers the audit metric.
func (s *Server) initVhosts() {
	s.vh.n = map[string]int{}
	s.vh.refusedLog = ratelog.Limiter{Every: time.Second, Burst: 5}
	s.vh.permRefusals = s.metrics.set.NewCounter("warren_permission_refusals_total")
	s.Broker.OnVhosts(s.vhostsChanged)
}

// vhostsChanged is the broker's OnVhosts hook (the topology's lock held:
// no blocking, no calls back).
func (s *Server) vhostsChanged(vs []broker.MetaVhost, removed []string) {
	m := make(map[string]broker.MetaVhost, len(vs))
	for _, v := range vs {
		m[v.Name] = v
	}
	s.vh.recs.Store(&m)
	if len(removed) > 0 {
		go s.closeVhosts(removed)
	}
}

// closeVhosts closes the connections of deleted vhosts, here and in the
// other fronts (OnVhostDeleted).
func (s *Server) closeVhosts(gone []string) {
	set := make(map[string]bool, len(gone))
	for _, v := range gone {
		set[v] = true
	}
	s.connsMu.Lock()
	var cs []*conn
	for _, c := range s.conns {
		if c.state.Load() == stOpen && set[c.vhostName()] {
			cs = append(cs, c)
		}
	}
	s.connsMu.Unlock()
	for _, c := range cs {
		c.closeWith(wire.ConnectionForced, "virtual host "+strconv.Quote(c.vhostName())+" was deleted")
	}
	s.vh.mu.Lock()
	fns := s.vh.deleted
	s.vh.mu.Unlock()
	for _, fn := range fns {
		for _, v := range gone {
			fn(v)
		}
	}
}

// OnVhostDeleted adds a function told of each vhost deleted at run time:
// another front (netio/amqp) closes its connections to it.
func (s *Server) OnVhostDeleted(fn func(vhost string)) {
	s.vh.mu.Lock()
	s.vh.deleted = append(s.vh.deleted, fn)
	s.vh.mu.Unlock()
}

// OpenVhost admits a connection of user into vhost ("" is "/"), for
// every front: the vhost must exist, the user must have permissions there
// (any entry; an administrator may open any vhost), and the vhost must be
// under its max_connections. On success the connection counts against the
// vhost until CloseVhost. The error is for the client: AuthFailed for an
// unknown vhost or no access (RabbitMQ refuses the open, as here, without
// telling which), ResourceLimit at the limit.
func (s *Server) OpenVhost(vhost, user string) (string, error) {
	if vhost == "" {
		vhost = broker.DefaultVhost
	}
	recs := s.vh.recs.Load()
	rec, ok := broker.MetaVhost{}, false
	if recs != nil {
		rec, ok = (*recs)[vhost]
	}
	if !ok || !s.hasVhostAccess(vhost, user) {
		s.auditRefusal(user, vhost, "open", "vhost", vhost)
		return "", reqErr(wire.AuthFailed, "access to virtual host %q refused for user %q: it does not exist or the user has no permissions there (an administrator grants them: PUT /api/permissions/{vhost}/%s)",
			vhost, user, user)
	}
	s.vh.mu.Lock()
	defer s.vh.mu.Unlock()
	if rec.MaxConnections > 0 && int64(s.vh.n[vhost]) >= rec.MaxConnections {
		return "", reqErr(wire.ResourceLimit, "virtual host %q is at its max_connections (%d)", vhost, rec.MaxConnections)
	}
	s.vh.n[vhost]++
	return vhost, nil
}

// Admitted reports whether user may still hold a connection to vhost: the
// user exists (or is the loopback guest) and the vhost exists with the
// user's access. A front (netio/amqp) asks once its connection is marked
// open, so that a deletion whose scan skipped it, not open yet, is seen.
func (s *Server) Admitted(vhost, user string) bool {
	if _, ok := s.auth.user(user); !ok && !(user == "guest" && s.auth.guestLoopback) {
		return false
	}
	recs := s.vh.recs.Load()
	if recs == nil {
		return false
	}
	if _, ok := (*recs)[vhost]; !ok {
		return false
	}
	return s.hasVhostAccess(vhost, user)
}

// CloseVhost uncounts a connection OpenVhost admitted.
func (s *Server) CloseVhost(vhost string) {
	s.vh.mu.Lock()
	if s.vh.n[vhost]--; s.vh.n[vhost] <= 0 {
		delete(s.vh.n, vhost)
	}
	s.vh.mu.Unlock()
}

// VhostConnections counts the connections open in a vhost, every front.
func (s *Server) VhostConnections(vhost string) int {
	s.vh.mu.Lock()
	defer s.vh.mu.Unlock()
	return s.vh.n[vhost]
}

// auditRefusal logs a permission refusal (at most 5 lines a second, with
// the count of those left out) and counts it in
// warren_permission_refusals_total.
func (s *Server) auditRefusal(user, vhost, perm, kind, name string) {
	if s.vh.permRefusals != nil {
		s.vh.permRefusals.Inc()
	}
	s.vh.refusedMu.Lock()
	ok, n := s.vh.refusedLog.Allow(time.Now())
	s.vh.refusedMu.Unlock()
	if ok {
		if len(user) > 64 {
			user = user[:64] + "…"
		}
		s.log.Warn("permission refused", "user", user, "vhost", vhost, "permission", perm, "resource", kind, "name", name, "suppressed_since_last", n)
	}
}

// vhostName is the connection's vhost ("/" before it opened one).
func (c *conn) vhostName() string {
	if v := c.vhost; v != "" {
		return v
	}
	return broker.DefaultVhost
}

// qn is the internal name of a name this connection gives.
func (c *conn) qn(name string) string { return broker.QualifyName(c.vhost, name) }

// local is err for this connection's client: the internal names quoted
// in it stripped of their vhost.
func (c *conn) local(err error) error {
	we, ok := err.(*wire.Error)
	if !ok || c.vhostName() == broker.DefaultVhost {
		return err
	}
	return &wire.Error{Code: we.Code, Reason: broker.LocalText(we.Reason)}
}

// localText is a reason for this connection's client (see local).
func (c *conn) localText(reason string) string {
	if c.vhostName() == broker.DefaultVhost {
		return reason
	}
	return broker.LocalText(reason)
}

// dlxOf is a queue declare's dead-letter exchange ("" none, or arguments
// the broker refuses anyway), for the permission check.
func dlxOf(args wire.Table) string {
	a, err := wire.ParseQueueArgs(args)
	if err != nil {
		return ""
	}
	return a.DeadLetterExchange
}

// queueLabels are a queue's labels in /metrics: {queue="name"} in "/", as
// before vhosts, and {queue="name",vhost="v"} in another vhost (never the
// internal name, whose separator is a control character).
func queueLabels(internal string) string {
	v, n := broker.SplitName(internal)
	if v == broker.DefaultVhost {
		return `{queue="` + promLabelValue(n) + `"}`
	}
	return `{queue="` + promLabelValue(n) + `",vhost="` + promLabelValue(v) + `"}`
}

// pubExchange is a PUBLISH's exchange as the client named it and its
// internal name, kept from the last batch: a run of batches to one
// exchange allocates neither. Loop goroutine.
func (c *conn) pubExchange(ex []byte) (local, internal string) {
	e := &c.scratch().pubEx
	if !e.set || string(ex) != e.local {
		e.local = string(ex)
		e.internal = c.qn(e.local)
		e.set = true
	}
	return e.local, e.internal
}
