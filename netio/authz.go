package netio

import (
	"fmt"
	"slices"

	"github.com/warren-mq/warren/wire"
)

// Action is what a user asks to do, for Authorize: the one authorization
// check behind both interfaces, the native protocol and the HTTP admin
// API.
type Action uint8

const (
	ActDelete  Action = iota + 1 // delete a queue or an exchange
	ActPurge                     // purge a queue
	ActUnbind                    // remove a binding
	ActOperate                   // an operator's write through the admin API
)

var actionNames = [...]string{ActDelete: "delete", ActPurge: "purge", ActUnbind: "unbind", ActOperate: "administer"}

// Authorize says whether user may do act to a resource declared by
// declaredBy ("" for the broker's own resources and those declared
// through the admin API). Administrators (the administrator tag; guest
// from loopback and the broker's internal client) may do anything;
// deleting, purging and unbinding are also allowed to the user who
// declared the resource. Permit (perms.go) is the permission check
// (configure, write, read) applied before it. what names the resource in the
// refusal ("queue \"orders\"").
func (s *Server) Authorize(user string, act Action, declaredBy, what string) error {
	if s.isAdmin(user) {
		return nil
	}
	switch act {
	case ActDelete, ActPurge, ActUnbind:
		if declaredBy != "" && declaredBy == user {
			return nil
		}
		return reqErr(wire.AccessRefused, "user %q may not %s %s: it needs the administrator tag or being the user who declared it", user, actionNames[act], what)
	case ActOperate:
		return reqErr(wire.AccessRefused, "writes need the administrator tag")
	}
	return reqErr(wire.AccessRefused, "user %q may not do this", user)
}

// AuthorizeOperator is Authorize for an operator's write through the admin
// API (ActOperate): nil for an administrator.
func (s *Server) AuthorizeOperator(user string) error { return s.Authorize(user, ActOperate, "", "") }

// isAdmin: a configured user with the administrator tag, the built-in
// guest (accepted from loopback only).
func (s *Server) isAdmin(user string) bool {
	if u, ok := s.auth.user(user); ok {
		return slices.Contains(u.Tags, "administrator")
	}
	return user == "guest"
}

// reqErr is a request-scoped protocol error.
func reqErr(code wire.Code, format string, args ...any) error {
	return &wire.Error{Code: code, Reason: fmt.Sprintf(format, args...)}
}
