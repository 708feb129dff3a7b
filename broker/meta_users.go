package broker

import (
	"regexp"
	"slices"
	"sort"
	"strconv"

	"github.com/warren-mq/warren/wire"
)

// MetaUser is a broker user as the metadata state machine keeps it.
// PasswordHash is a bcrypt hash (salted: the runtime draws the salt and
// hashes before the command, so Apply stays pure); the password itself is
// never in a command, the log or a snapshot.
type MetaUser struct {
	Name         string
	PasswordHash string
	Tags         []string
}

// Bounds of one user account (what an administrator can make the broker
// hold, beside MetaLimits.MaxUsers).
const (
	maxUserName = 255 // bytes, like every name
	maxUserHash = 255 // bytes; a bcrypt hash is 60
	maxUserTags = 16
	maxUserTag  = 64 // bytes
)

func (m *Meta) putUser(c *MetaCommand) (MetaResult, []MetaEffect) {
	u := &c.Account
	if !c.Admin {
		return refuse(wire.AccessRefused, "changing users needs the administrator tag"), nil
	}
	if err := checkMetaUser(u); err != nil {
		return refuseErr(err), nil
	}
	old, exists := m.users[u.Name]
	if exists && (c.IfAbsent || (old.PasswordHash == u.PasswordHash && slices.Equal(old.Tags, u.Tags))) {
		return MetaResult{}, nil // nothing changes
	}
	if !exists && len(m.users) >= m.limits.MaxUsers {
		return refuse(wire.LimitReached, "user limit reached: the broker holds "+strconv.Itoa(len(m.users))+" users, its max_users (delete users first)"), nil
	}
	nu := MetaUser{Name: u.Name, PasswordHash: u.PasswordHash, Tags: slices.Clone(u.Tags)}
	m.users[u.Name] = &nu
	return MetaResult{}, []MetaEffect{{Kind: EffUserPut, Name: u.Name}}
}

// checkMetaUser checks a user's bounds (its name, hash and tags): by the
// metadata machine, and before the command is logged or proposed (the
// metadata decoder refuses a user of more than maxUserTags tags: in a
// cluster, a command is in every node's log before any machine sees it).
func checkMetaUser(u *MetaUser) error {
	switch {
	case u.Name == "" || len(u.Name) > maxUserName:
		return reqErr(wire.InvalidArgument, "a user name is 1 to %d bytes", maxUserName)
	case u.PasswordHash == "" || len(u.PasswordHash) > maxUserHash:
		return reqErr(wire.InvalidArgument, "user %s needs a password hash of 1 to %d bytes", strconv.Quote(u.Name), maxUserHash)
	case len(u.Tags) > maxUserTags:
		return reqErr(wire.InvalidArgument, "user %s: at most %d tags", strconv.Quote(u.Name), maxUserTags)
	}
	for _, t := range u.Tags {
		if t == "" || len(t) > maxUserTag {
			return reqErr(wire.InvalidArgument, "user %s: a tag is 1 to %d bytes", strconv.Quote(u.Name), maxUserTag)
		}
	}
	return nil
}

func (m *Meta) deleteUser(c *MetaCommand) (MetaResult, []MetaEffect) {
	if !c.Admin {
		return refuse(wire.AccessRefused, "changing users needs the administrator tag"), nil
	}
	if _, ok := m.users[c.Account.Name]; !ok {
		return refuse(wire.NotFound, "no user "+strconv.Quote(c.Account.Name)), nil
	}
	delete(m.users, c.Account.Name)
	for k, p := range m.perms {
		if p.User == c.Account.Name {
			delete(m.perms, k)
		}
	}
	return MetaResult{Removed: true}, []MetaEffect{{Kind: EffUserRemoved, Name: c.Account.Name}}
}

// User is the user name, if it exists.
func (m *Meta) User(name string) (MetaUser, bool) {
	u, ok := m.users[name]
	if !ok {
		return MetaUser{}, false
	}
	return MetaUser{Name: u.Name, PasswordHash: u.PasswordHash, Tags: slices.Clone(u.Tags)}, true
}

// Users lists the users, by name.
func (m *Meta) Users() []MetaUser {
	out := make([]MetaUser, 0, len(m.users))
	for _, u := range m.users {
		out = append(out, MetaUser{Name: u.Name, PasswordHash: u.PasswordHash, Tags: slices.Clone(u.Tags)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// diffUsers: the user effects that turn a's users into b's.
func diffUsers(a, b *Meta) []MetaEffect {
	var effs []MetaEffect
	for _, u := range a.Users() {
		if _, ok := b.users[u.Name]; !ok {
			effs = append(effs, MetaEffect{Kind: EffUserRemoved, Name: u.Name})
		}
	}
	for _, u := range b.Users() {
		if o, ok := a.users[u.Name]; !ok || o.PasswordHash != u.PasswordHash || !slices.Equal(o.Tags, u.Tags) {
			effs = append(effs, MetaEffect{Kind: EffUserPut, Name: u.Name})
		}
	}
	for _, p := range a.Permissions() {
		if np, ok := b.perms[permKey(p.Vhost, p.User)]; !ok || *np != p {
			effs = append(effs, MetaEffect{Kind: EffPermissionsChanged, Name: p.User})
		}
	}
	for _, p := range b.Permissions() {
		if _, ok := a.perms[permKey(p.Vhost, p.User)]; !ok {
			effs = append(effs, MetaEffect{Kind: EffPermissionsChanged, Name: p.User})
		}
	}
	return effs
}

func appendMetaUser(dst []byte, u *MetaUser) []byte {
	dst = appendMetaStr(dst, u.Name)
	dst = appendMetaStr(dst, u.PasswordHash)
	dst = append(dst, byte(len(u.Tags)))
	for _, t := range u.Tags {
		dst = appendMetaStr(dst, t)
	}
	return dst
}

func (r *metaReader) metaUser() MetaUser {
	u := MetaUser{Name: r.str(), PasswordHash: r.str()}
	n := int(r.u8())
	if r.err == nil && n > maxUserTags {
		r.fail("user " + strconv.Quote(u.Name) + " with " + strconv.Itoa(n) + " tags")
		return u
	}
	for i := 0; i < n && r.err == nil; i++ {
		u.Tags = append(u.Tags, r.str())
	}
	return u
}

// MetaPermission is what a user may do in a virtual host, as RabbitMQ has
// it: regular expressions over resource names (exchanges and queues) for
// configure (declare, delete), write (publish, a bind's destination) and
// read (consume, get, purge, a bind's source). An empty one matches
// nothing. Names are the client's, within Vhost.
type MetaPermission struct {
	Vhost, User            string
	Configure, Write, Read string
}

// maxPermPattern bounds one permission's regular expression.
const maxPermPattern = 1024

func permKey(vhost, user string) string { return vhost + "\x00" + user }

func (m *Meta) setPermission(c *MetaCommand) (MetaResult, []MetaEffect) {
	p := c.Permission
	if !c.Admin {
		return refuse(wire.AccessRefused, "changing permissions needs the administrator tag"), nil
	}
	if _, ok := m.vhosts[p.Vhost]; !ok {
		return refuse(wire.NotFound, "no virtual host "+strconv.Quote(p.Vhost)+" (create it first: PUT /api/vhosts/{vhost})"), nil
	}
	if _, ok := m.users[p.User]; !ok {
		return refuse(wire.NotFound, "no user "+strconv.Quote(p.User)+" (create it first)"), nil
	}
	for _, x := range []struct{ what, re string }{{"configure", p.Configure}, {"write", p.Write}, {"read", p.Read}} {
		if len(x.re) > maxPermPattern {
			return refuse(wire.InvalidArgument, x.what+" pattern longer than "+strconv.Itoa(maxPermPattern)+" bytes"), nil
		}
		if _, err := regexp.Compile(x.re); err != nil {
			return refuse(wire.InvalidArgument, x.what+" is not a regular expression (Go RE2 syntax): "+err.Error()), nil
		}
	}
	k := permKey(p.Vhost, p.User)
	old, exists := m.perms[k]
	if exists && *old == p {
		return MetaResult{}, nil
	}
	if !exists && len(m.perms) >= m.limits.MaxPermissions {
		return refuse(wire.LimitReached, "permission limit reached: the broker holds "+strconv.Itoa(len(m.perms))+" permission entries, its max_permissions (clear some first)"), nil
	}
	m.perms[k] = &p
	return MetaResult{}, []MetaEffect{{Kind: EffPermissionsChanged, Name: p.User}}
}

func (m *Meta) clearPermission(c *MetaCommand) (MetaResult, []MetaEffect) {
	if !c.Admin {
		return refuse(wire.AccessRefused, "changing permissions needs the administrator tag"), nil
	}
	k := permKey(c.Permission.Vhost, c.Permission.User)
	if _, ok := m.perms[k]; !ok {
		return refuse(wire.NotFound, "no permissions for user "+strconv.Quote(c.Permission.User)+" in "+strconv.Quote(c.Permission.Vhost)), nil
	}
	delete(m.perms, k)
	return MetaResult{Removed: true}, []MetaEffect{{Kind: EffPermissionsChanged, Name: c.Permission.User}}
}

// Permissions lists the permission entries, by vhost then user.
func (m *Meta) Permissions() []MetaPermission {
	out := make([]MetaPermission, 0, len(m.perms))
	for _, p := range m.perms {
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Vhost != out[j].Vhost {
			return out[i].Vhost < out[j].Vhost
		}
		return out[i].User < out[j].User
	})
	return out
}

func appendMetaPermission(dst []byte, p *MetaPermission) []byte {
	for _, s := range []string{p.Vhost, p.User, p.Configure, p.Write, p.Read} {
		dst = appendMetaStr(dst, s)
	}
	return dst
}

func (r *metaReader) metaPermission() MetaPermission {
	return MetaPermission{Vhost: r.str(), User: r.str(), Configure: r.str(), Write: r.str(), Read: r.str()}
}
