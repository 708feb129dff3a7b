package netio

import (
	"crypto/subtle"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// User is a broker user. PasswordHash is a bcrypt hash (make one with
// `warrenctl hash-password` or any bcrypt tool); passwords are never kept
// in clear.
type User struct {
	Name         string   `json:"name"`
	PasswordHash string   `json:"password_hash"`
	Tags         []string `json:"tags,omitempty"` // "administrator" allows admin writes
}

type authenticator struct {
	users         atomic.Pointer[map[string]User]
	guestLoopback bool
	internalPass  string // for clients inside this process (admin replay)

	log *slog.Logger

	// Seams for tests: the password comparison, the clock and waiting.
	compare func(hash, pass []byte) error
	now     func() time.Time
	sleep   func(time.Duration)
}

func newAuthenticator(users []User, guestLoopback bool) *authenticator {
	a := &authenticator{guestLoopback: guestLoopback, internalPass: randomSecret(),
		compare: bcrypt.CompareHashAndPassword, now: time.Now, sleep: time.Sleep, log: slog.New(slog.DiscardHandler)}
	a.setUsers(users)
	return a
}

func (a *authenticator) setUsers(users []User) {
	m := map[string]User{}
	for _, u := range users {
		m[u.Name] = u
	}
	a.users.Store(&m)
}

func (a *authenticator) user(name string) (User, bool) {
	u, ok := (*a.users.Load())[name]
	return u, ok
}

// dummyHash is compared against when the user does not exist, so a failed
// login takes as long for an unknown user as for a wrong password.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("warren-dummy"), bcrypt.MinCost)

// check verifies a user's password. The default guest/guest account is
// accepted only from loopback addresses, and only if no user named guest is
// configured. remote is the client's address (host:port or host).
func (a *authenticator) check(user, pass, remote string, loopback bool) bool {
	if user == internalUser {
		return loopback && subtle.ConstantTimeCompare([]byte(pass), []byte(a.internalPass)) == 1
	}
	u, ok := a.user(user)
	if !ok {
		if user == "guest" && a.guestLoopback && loopback {
			return subtle.ConstantTimeCompare([]byte(pass), []byte("guest")) == 1
		}
		_ = a.compare(dummyHash, []byte(pass))
		return false
	}
	return a.compare([]byte(u.PasswordHash), []byte(pass)) == nil
}

// sourceHost is the host part of a remote address.
func sourceHost(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// HashPassword returns a bcrypt hash for a config file.
func HashPassword(pass string) (string, error) {
	h, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.DefaultCost)
	return string(h), err
}

// refusal is the reason given for a failed login. It never says whether
// the user or the password was wrong, except for the built-in guest, whose
// rule is public: accepted from loopback addresses only.
func (a *authenticator) refusal(user string, loopback bool) string {
	if _, configured := a.user(user); user == "guest" && !configured && a.guestLoopback && !loopback {
		return "authentication failed: the built-in guest user is accepted from loopback addresses only; connect from the broker's host, or configure a user (warrend hash-password)"
	}
	return "authentication failed"
}
