package netio

import (
	"net/url"
	"regexp"
	"strconv"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// Perm is one of RabbitMQ's three permissions over resource names
// (issue 15): configure (declare, delete), write (publish to an exchange,
// bind to a queue or to a destination exchange), read (consume, get, purge
// a queue; bind from an exchange).
type Perm uint8

const (
	PermConfigure Perm = iota
	PermWrite
	PermRead
)

var permNames = [...]string{PermConfigure: "configure", PermWrite: "write", PermRead: "read"}

// DefaultExchangeResource is the resource name of the default exchange
// ("") in permissions, as RabbitMQ names it.
const DefaultExchangeResource = "amq.default"

// GeneratedQueueResource is the resource name a declare of a server-named
// queue is checked against (the name it gets starts with it).
const GeneratedQueueResource = "amq.gen-"

// permTable is the permissions in force, compiled once per change (never
// per request): by vhost and user (permKey). gen changes with every table.
type permTable struct {
	gen uint64
	m   map[string]*[3]*regexp.Regexp // nil regexp: matches nothing
}

func permKey(vhost, user string) string { return vhost + "\x00" + user }

// setPerms compiles the permissions (Meta checked that they compile).
func (s *Server) setPerms(ps []broker.MetaPermission) {
	t := &permTable{gen: s.permGen.Add(1), m: make(map[string]*[3]*regexp.Regexp, len(ps))}
	for _, p := range ps {
		var res [3]*regexp.Regexp
		for i, src := range [3]string{p.Configure, p.Write, p.Read} {
			if src == "" {
				continue // RabbitMQ: the empty pattern matches nothing
			}
			if re, err := regexp.Compile(src); err == nil {
				res[i] = re
			}
		}
		t.m[permKey(p.Vhost, p.User)] = &res
	}
	s.perms.Store(t)
}

// Permit is the one permission check of every front (the native
// protocol, netio/amqp, the admin API): nil if user may do p on the
// resource kind ("queue" or "exchange") name, else access_refused naming
// the permission and the resource. Administrators (the administrator tag;
// guest from loopback) may do anything; any other user needs a permission
// entry (PUT /api/permissions/%2F/{user}) whose pattern matches. It
// checks in the vhost "/": PermitIn names the vhost.
func (s *Server) Permit(user string, p Perm, kind, name string) error {
	return s.PermitIn(broker.DefaultVhost, user, p, kind, name)
}

// PermitIn is Permit in a vhost (name is the client's, in that vhost).
// A refusal is logged (rate-limited) and counted (auditRefusal).
func (s *Server) PermitIn(vhost, user string, p Perm, kind, name string) error {
	if s.permitted(vhost, user, p, name) {
		return nil
	}
	s.auditRefusal(user, vhost, permNames[p], kind, name)
	return reqErr(wire.AccessRefused, "user %q has no %s permission on %s %s in vhost %q (an administrator grants it: PUT /api/permissions/%s/%s)",
		user, permNames[p], kind, strconv.Quote(name), vhost, url.PathEscape(vhost), user)
}

func (s *Server) permitted(vhost, user string, p Perm, name string) bool {
	if s.isAdmin(user) {
		return true
	}
	t := s.perms.Load()
	if t == nil {
		return false
	}
	res := t.m[permKey(vhost, user)]
	return res != nil && res[p] != nil && res[p].MatchString(name)
}

// hasVhostAccess: an administrator, or a user with a permission entry in
// the vhost (RabbitMQ's first level of access control).
func (s *Server) hasVhostAccess(vhost, user string) bool {
	if s.isAdmin(user) {
		return true
	}
	t := s.perms.Load()
	return t != nil && t.m[permKey(vhost, user)] != nil
}

// PermGen changes whenever the permissions (or users) change: a front
// that caches a decision (the publish path, per exchange) drops it then.
func (s *Server) PermGen() uint64 { return s.permGen.Load() }

// exchangeResource is an exchange's name in permissions.
func exchangeResource(name string) string {
	if name == "" {
		return DefaultExchangeResource
	}
	return name
}

// PublishPerms caches, for one connection, whether its user may publish
// (write) to each exchange, decided once per exchange per permissions
// change: no regexp and no allocation per publish in steady state. Not
// safe for concurrent use: one per connection, used by its reader.
type PublishPerms struct {
	gen uint64
	ok  map[string]bool
}

// Allowed reports whether user may publish to exchange ("" the default),
// in "/".
func (pp *PublishPerms) Allowed(s *Server, user, exchange string) bool {
	return pp.AllowedIn(s, broker.DefaultVhost, user, exchange)
}

// AllowedIn is Allowed in a vhost (one per connection: a connection's
// vhost does not change).
func (pp *PublishPerms) AllowedIn(s *Server, vhost, user, exchange string) bool {
	if g := s.PermGen(); g != pp.gen || pp.ok == nil {
		if pp.ok == nil {
			pp.ok = map[string]bool{}
		}
		clear(pp.ok)
		pp.gen = g
	}
	ok, hit := pp.ok[exchange]
	if !hit {
		if len(pp.ok) >= 1024 {
			clear(pp.ok) // bounded: only re-decided
		}
		ok = s.permitted(vhost, user, PermWrite, exchangeResource(exchange))
		pp.ok[exchange] = ok
	}
	return ok
}

// PublishRefusal is the access_refused reason for a publish Allowed
// refused (logged and counted as a refusal).
func (s *Server) PublishRefusal(user, exchange string) error {
	return s.PublishRefusalIn(broker.DefaultVhost, user, exchange)
}

// PublishRefusalIn is PublishRefusal in a vhost.
func (s *Server) PublishRefusalIn(vhost, user, exchange string) error {
	return s.PermitIn(vhost, user, PermWrite, "exchange", exchangeResource(exchange))
}

// PermitDeclare: a declare needs configure on what it declares; a passive
// one (only looks) needs nothing, as in RabbitMQ. A server-named queue is
// checked as GeneratedQueueResource.
func (s *Server) PermitDeclare(user string, passive bool, kind, name string) error {
	return s.PermitDeclareIn(broker.DefaultVhost, user, passive, kind, name, "")
}

// PermitDeclareIn is PermitDeclare in a vhost, with the declare's target
// exchange: an exchange's alternate exchange, a queue's dead-letter
// exchange ("" none). As in RabbitMQ, a declare with one also needs write
// on the target and read on what it declares: the target gets what the
// declared resource would otherwise drop, so the user must be allowed to
// publish there, and to read what it declares.
func (s *Server) PermitDeclareIn(vhost, user string, passive bool, kind, name, target string) error {
	if passive {
		return nil
	}
	if kind == "queue" && name == "" {
		name = GeneratedQueueResource
	}
	if kind == "exchange" {
		name = exchangeResource(name)
	}
	if err := s.PermitIn(vhost, user, PermConfigure, kind, name); err != nil {
		return err
	}
	if target == "" {
		return nil
	}
	if err := s.PermitIn(vhost, user, PermWrite, "exchange", target); err != nil {
		return err
	}
	return s.PermitIn(vhost, user, PermRead, kind, name)
}

// PermitBind: a binding (and its removal) needs write on its destination
// (queue or exchange) and read on its source exchange, as in RabbitMQ.
func (s *Server) PermitBind(user, source, destination string, toExchange bool) error {
	return s.PermitBindIn(broker.DefaultVhost, user, source, destination, toExchange)
}

// PermitBindIn is PermitBind in a vhost.
func (s *Server) PermitBindIn(vhost, user, source, destination string, toExchange bool) error {
	kind := "queue"
	if toExchange {
		kind, destination = "exchange", exchangeResource(destination)
	}
	if err := s.PermitIn(vhost, user, PermWrite, kind, destination); err != nil {
		return err
	}
	return s.PermitIn(vhost, user, PermRead, "exchange", exchangeResource(source))
}
