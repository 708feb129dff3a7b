package broker

import (
	"slices"
	"sort"
	"strconv"

	"github.com/warren-mq/warren/wire"
)

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
	switch {
	case u.Name == "" || len(u.Name) > maxUserName:
		return refuse(wire.InvalidArgument, "a user name is 1 to "+strconv.Itoa(maxUserName)+" bytes"), nil
	case u.PasswordHash == "" || len(u.PasswordHash) > maxUserHash:
		return refuse(wire.InvalidArgument, "user "+strconv.Quote(u.Name)+" needs a password hash of 1 to "+strconv.Itoa(maxUserHash)+" bytes"), nil
	case len(u.Tags) > maxUserTags:
		return refuse(wire.InvalidArgument, "user "+strconv.Quote(u.Name)+": at most "+strconv.Itoa(maxUserTags)+" tags"), nil
	}
	for _, t := range u.Tags {
		if t == "" || len(t) > maxUserTag {
			return refuse(wire.InvalidArgument, "user "+strconv.Quote(u.Name)+": a tag is 1 to "+strconv.Itoa(maxUserTag)+" bytes"), nil
		}
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

func (m *Meta) deleteUser(c *MetaCommand) (MetaResult, []MetaEffect) {
	if !c.Admin {
		return refuse(wire.AccessRefused, "changing users needs the administrator tag"), nil
	}
	if _, ok := m.users[c.Account.Name]; !ok {
		return refuse(wire.NotFound, "no user "+strconv.Quote(c.Account.Name)), nil
	}
	delete(m.users, c.Account.Name)
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
