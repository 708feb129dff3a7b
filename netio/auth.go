package netio

import (
	"crypto/subtle"

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
	users         map[string]User
	guestLoopback bool
	internalPass  string // for clients inside this process (admin replay)
}

func newAuthenticator(users []User, guestLoopback bool) *authenticator {
	a := &authenticator{users: map[string]User{}, guestLoopback: guestLoopback, internalPass: randomSecret()}
	for _, u := range users {
		a.users[u.Name] = u
	}
	return a
}

// dummyHash is compared against when the user does not exist, so a failed
// login takes as long for an unknown user as for a wrong password.
var dummyHash, _ = bcrypt.GenerateFromPassword([]byte("warren-dummy"), bcrypt.MinCost)

// check verifies a user's password. The default guest/guest account is
// accepted only from loopback addresses, and only if no user named guest is
// configured.
func (a *authenticator) check(user, pass string, loopback bool) bool {
	if user == internalUser {
		return loopback && subtle.ConstantTimeCompare([]byte(pass), []byte(a.internalPass)) == 1
	}
	u, ok := a.users[user]
	if !ok {
		if user == "guest" && a.guestLoopback && loopback {
			return subtle.ConstantTimeCompare([]byte(pass), []byte("guest")) == 1
		}
		_ = bcrypt.CompareHashAndPassword(dummyHash, []byte(pass))
		return false
	}
	return bcrypt.CompareHashAndPassword([]byte(u.PasswordHash), []byte(pass)) == nil
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
	if _, configured := a.users[user]; user == "guest" && !configured && a.guestLoopback && !loopback {
		return "authentication failed: the built-in guest user is accepted from loopback addresses only; connect from the broker's host, or configure a user (warrend hash-password)"
	}
	return "authentication failed"
}
