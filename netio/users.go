package netio

import (
	"context"
	"fmt"

	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// bootstrapUsers makes the broker's users (the metadata state machine's,
// durable with a data directory) the authenticator's, from now on, and
// creates the config file's users that do not exist yet.
func (s *Server) bootstrapUsers(users []User) error {
	s.initVhosts()
	s.Broker.OnUsers(s.usersChanged)
	mu := make([]broker.MetaUser, len(users))
	var absent []string
	for i, u := range users {
		mu[i] = broker.MetaUser{Name: u.Name, PasswordHash: u.PasswordHash, Tags: u.Tags}
		if _, ok := s.Broker.User(u.Name); !ok {
			absent = append(absent, u.Name)
		}
	}
	if err := s.Broker.EnsureUsers(context.Background(), mu); err != nil {
		return fmt.Errorf("creating the config file's users: %w", err)
	}
	// A config-file user gets every permission in "/" when it is created
	// (as RabbitMQ's default user does): what it could do before
	// permissions existed. Run-time changes win afterwards.
	for _, n := range absent {
		p := broker.MetaPermission{Vhost: "/", User: n, Configure: ".*", Write: ".*", Read: ".*"}
		if err := s.Broker.SetPermission(context.Background(), p); err != nil {
			return fmt.Errorf("granting the config file's user %q its permissions: %w", n, err)
		}
	}
	return nil
}

// usersChanged is the broker's OnUsers hook (the topology's lock held: it
// neither blocks nor calls back): the authenticator gets the new table,
// and the connections of removed users are closed.
func (s *Server) usersChanged(users []broker.MetaUser, perms []broker.MetaPermission, removed []string) {
	us := make([]User, len(users))
	for i, u := range users {
		us[i] = User{Name: u.Name, PasswordHash: u.PasswordHash, Tags: u.Tags}
	}
	s.auth.setUsers(us)
	s.setPerms(perms)
	if len(removed) == 0 {
		return
	}
	gone := make(map[string]bool, len(removed))
	for _, n := range removed {
		gone[n] = true
	}
	go s.closeUsers(gone)
}

// closeUsers closes the open connections of the users in gone (deleted),
// with connection_forced.
func (s *Server) closeUsers(gone map[string]bool) {
	s.connsMu.Lock()
	var cs []*conn
	for _, c := range s.conns {
		if c.state.Load() == stOpen && gone[c.user] {
			cs = append(cs, c)
		}
	}
	s.connsMu.Unlock()
	for _, c := range cs {
		c.closeWith(wire.ConnectionForced, "user "+fmt.Sprintf("%q", c.user)+" was deleted")
	}
	for n := range gone {
		if f := s.userDeleted.Load(); f != nil {
			(*f)(n)
		}
	}
}

// OnUserDeleted adds a function told of each user deleted at run time,
// after the native connections of that user are closed: another front
// (netio/amqp) closes its own. Each one added is told.
func (s *Server) OnUserDeleted(fn func(user string)) {
	for {
		old := s.userDeleted.Load()
		both := fn
		if old != nil {
			prev := *old
			both = func(user string) { prev(user); fn(user) }
		}
		if s.userDeleted.CompareAndSwap(old, &both) {
			return
		}
	}
}
