package broker

import "context"

// This file is the runtime side of the users the metadata state machine
// keeps (issue 15): the operator's commands, and the hook that tells the
// authenticator.

// usersChangedLocked tells onUsers of the user effects in effs (mu held).
func (t *topology) usersChangedLocked(effs []MetaEffect) {
	if t.onUsers == nil {
		return
	}
	var removed []string
	for _, e := range effs {
		if e.Kind == EffUserRemoved {
			removed = append(removed, e.Name)
		}
	}
	t.onUsers(t.meta.Users(), t.meta.Permissions(), removed)
}

// OnUsers sets the function told of every change to the users or their
// permissions: all of them, and the names of the users removed. It is called with the topology's
// lock held: it must not call back into the broker, nor block. It is
// called once now with the current users.
func (b *Broker) OnUsers(fn func(users []MetaUser, perms []MetaPermission, removed []string)) {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onUsers = fn
	if fn != nil {
		fn(t.meta.Users(), t.meta.Permissions(), nil)
	}
}

// Users lists the users, by name.
func (b *Broker) Users() []MetaUser {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta.Users()
}

// User is one user, if it exists.
func (b *Broker) User(name string) (MetaUser, bool) {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta.User(name)
}

// PutUser creates or replaces a user, as an operator (u.PasswordHash is
// already a salted hash), and waits for it to be durable (with a metadata
// log).
func (b *Broker) PutUser(ctx context.Context, u MetaUser) error {
	return b.userCommand(ctx, &MetaCommand{Op: MetaPutUser, Admin: true, Account: u})
}

// EnsureUsers creates the users that do not exist (the config file's
// bootstrap users): one that exists, changed at run time or not, is left
// as it is.
func (b *Broker) EnsureUsers(ctx context.Context, us []MetaUser) error {
	for _, u := range us {
		if err := b.userCommand(ctx, &MetaCommand{Op: MetaPutUser, Admin: true, Account: u, IfAbsent: true}); err != nil {
			return err
		}
	}
	return nil
}

// DeleteUser removes a user (not_found if there is none); the runtime
// closes its connections (OnUsers).
func (b *Broker) DeleteUser(ctx context.Context, name string) error {
	return b.userCommand(ctx, &MetaCommand{Op: MetaDeleteUser, Admin: true, Account: MetaUser{Name: name}})
}

func (b *Broker) userCommand(ctx context.Context, c *MetaCommand) error {
	t := b.topo
	// Bounds before the log: in a cluster the command is proposed, and in
	// every node's log, before any machine could refuse it.
	switch c.Op {
	case MetaPutUser:
		if err := checkMetaUser(&c.Account); err != nil {
			return err
		}
	case MetaPutVhost:
		if err := checkMetaVhost(&c.Vhost); err != nil {
			return err
		}
	}
	if cl := t.cl.Load(); cl != nil {
		return t.clusterChange(cl, c).Err()
	}
	t.mu.Lock()
	c.NowMs = t.now()
	err := t.applyLocked(c).Err()
	t.mu.Unlock()
	if err != nil {
		return err
	}
	return t.sync(ctx, syncFor{})
}

// SetPermission sets a user's permissions in a vhost, as an operator.
func (b *Broker) SetPermission(ctx context.Context, p MetaPermission) error {
	return b.userCommand(ctx, &MetaCommand{Op: MetaSetPermission, Admin: true, Permission: p})
}

// ClearPermission removes a user's permissions in a vhost (not_found if
// it has none there).
func (b *Broker) ClearPermission(ctx context.Context, vhost, user string) error {
	return b.userCommand(ctx, &MetaCommand{Op: MetaClearPermission, Admin: true, Permission: MetaPermission{Vhost: vhost, User: user}})
}

// Permissions lists the permission entries, by vhost then user.
func (b *Broker) Permissions() []MetaPermission {
	t := b.topo
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.meta.Permissions()
}
