package netio

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"github.com/warren-mq/warren/internal/ratelog"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// User is a broker user. PasswordHash is a bcrypt hash (make one with
// `warrend hash-password` or any bcrypt tool); passwords are never kept
// in clear.
type User struct {
	Name         string   `json:"name"`
	PasswordHash string   `json:"password_hash"`
	Tags         []string `json:"tags,omitempty"` // "administrator" allows admin writes
}

// Limits of the authenticator. Each bounds something a client can make the
// broker hold or spend.
const (
	credCacheTTL   = 60 * time.Second // verified credentials are trusted this long
	credCacheMax   = 1024             // at most this many remembered credentials
	failWindow     = 10 * time.Minute // a source's failures are forgotten after this long without one
	failFree       = 3                // failures from one source before its attempts are slowed
	failDelayBase  = 250 * time.Millisecond
	failDelayMax   = 5 * time.Second // below the handshake deadline, so a slowed client still gets its answer
	failSourcesMax = 10_000          // source addresses tracked; past it an arbitrary one is forgotten
)

// authenticator checks credentials for the native protocol and the admin
// API alike. Password checks are bcrypt, slow on purpose, so it:
//   - compares an unknown user's password against a decoy hash of the same
//     cost as the configured users' (no username enumeration by timing);
//   - runs at most maxChecks comparisons at once (a login storm cannot take
//     every core from the data plane), never on an event loop;
//   - slows down repeated failures from one source address;
//   - remembers verified credentials for credCacheTTL, keyed by an HMAC of
//     user and password under a per-process key (never the password), so
//     an admin client does not pay a bcrypt check per request;
//   - logs failed logins (user, source, reason), rate-limited (refused).
type authenticator struct {
	users         atomic.Pointer[userTable]
	guestLoopback bool
	log           *slog.Logger

	checks   chan struct{} // semaphore: bcrypt comparisons in progress
	cacheKey []byte
	cacheMu  sync.Mutex
	cache    map[[sha256.Size]byte]credEntry
	failMu   sync.Mutex
	fails    map[string]failState
	failLog  ratelog.Limiter
	delayed  atomic.Uint64 // attempts slowed down (warren_auth_delayed_total)

	// Seams for tests: the password comparison, the clock and waiting.
	compare func(hash, pass []byte) error
	now     func() time.Time
	sleep   func(time.Duration)

	// comparing, if set, is called as a check takes its turn for a
	// comparison (Server.Changed).
	comparing func()
}

// userTable is one version of the configured users, replaced whole.
type userTable struct {
	m         map[string]User
	decoyCost int
	decoyOnce sync.Once
	decoy     []byte
}

// decoyHash is the hash an unknown user's password is compared against: a
// bcrypt hash at the highest cost among the users' hashes, made on first
// use (making it costs one check).
func (t *userTable) decoyHash() []byte {
	t.decoyOnce.Do(func() {
		h, err := bcrypt.GenerateFromPassword([]byte("warren-decoy"), t.decoyCost)
		if err != nil {
			panic("netio: decoy bcrypt hash: " + err.Error())
		}
		t.decoy = h
	})
	return t.decoy
}

type credEntry struct {
	hash    string // the PasswordHash the credentials were verified against
	expires time.Time
}

type failState struct {
	n    int       // failures in the current run
	last time.Time // the latest one
}

func newAuthenticator(users []User, guestLoopback bool) *authenticator {
	a := &authenticator{guestLoopback: guestLoopback,
		log:    slog.New(slog.DiscardHandler),
		checks: make(chan struct{}, maxChecks()), cacheKey: []byte(randomSecret()),
		cache: map[[sha256.Size]byte]credEntry{}, fails: map[string]failState{},
		failLog: ratelog.Limiter{Every: time.Second, Burst: 5},
		compare: bcrypt.CompareHashAndPassword, now: time.Now, sleep: time.Sleep}
	a.setUsers(users)
	return a
}

// maxChecks bounds concurrent bcrypt comparisons: half the cores, at least
// one, so logins never take the whole machine.
func maxChecks() int { return max(1, runtime.GOMAXPROCS(0)/2) }

// setUsers replaces the user table and forgets every verified credential.
func (a *authenticator) setUsers(users []User) {
	t := &userTable{m: map[string]User{}, decoyCost: bcrypt.MinCost}
	for _, u := range users {
		t.m[u.Name] = u
		if c, err := bcrypt.Cost([]byte(u.PasswordHash)); err == nil && c > t.decoyCost {
			t.decoyCost = c
		}
	}
	a.users.Store(t)
	a.cacheMu.Lock()
	clear(a.cache)
	a.cacheMu.Unlock()
}

func (a *authenticator) user(name string) (User, bool) {
	u, ok := a.users.Load().m[name]
	return u, ok
}

// check verifies a user's password. The default guest/guest account is
// accepted only from loopback addresses, and only if no user named guest is
// configured. remote is the client's address (host:port or host). It may
// block (bounded concurrency, slowed failures): never call it on an event
// loop.
func (a *authenticator) check(user, pass, remote string, loopback bool) bool {
	t := a.users.Load()
	u, known := t.m[user]
	if !known && user == "guest" && a.guestLoopback && loopback {
		if subtle.ConstantTimeCompare([]byte(pass), []byte("guest")) == 1 {
			return true
		}
		a.refused(user, remote, "bad_password")
		return false
	}
	key := a.credKey(user, pass) // computed for unknown users too: same work
	if known && a.cached(key, u) {
		return true
	}
	src := sourceHost(remote)
	if d := a.failDelay(src); d > 0 {
		a.delayed.Add(1)
		a.sleep(d)
	}
	hash := t.decoyHash()
	if known {
		hash = []byte(u.PasswordHash)
	}
	if a.comparing != nil {
		a.comparing()
	}
	a.checks <- struct{}{}
	err := a.compare(hash, []byte(pass))
	<-a.checks
	if known && err == nil {
		a.remember(key, u)
		a.failMu.Lock()
		delete(a.fails, src)
		a.failMu.Unlock()
		return true
	}
	a.recordFailure(src)
	switch {
	case known:
		a.refused(user, remote, "bad_password")
	case user == "guest" && a.guestLoopback:
		a.refused(user, remote, "guest_not_loopback")
	default:
		a.refused(user, remote, "unknown_user")
	}
	return false
}

func (a *authenticator) credKey(user, pass string) [sha256.Size]byte {
	m := hmac.New(sha256.New, a.cacheKey)
	m.Write([]byte(user))
	m.Write([]byte{0})
	m.Write([]byte(pass))
	var k [sha256.Size]byte
	m.Sum(k[:0])
	return k
}

// cached reports whether these credentials were verified for u, as it is
// now, within credCacheTTL.
func (a *authenticator) cached(key [sha256.Size]byte, u User) bool {
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	e, ok := a.cache[key]
	if !ok {
		return false
	}
	if e.hash != u.PasswordHash || !a.now().Before(e.expires) {
		delete(a.cache, key)
		return false
	}
	return true
}

func (a *authenticator) remember(key [sha256.Size]byte, u User) {
	now := a.now()
	a.cacheMu.Lock()
	defer a.cacheMu.Unlock()
	if _, ok := a.cache[key]; !ok && len(a.cache) >= credCacheMax {
		for k, e := range a.cache {
			if !now.Before(e.expires) {
				delete(a.cache, k)
			}
		}
		for k := range a.cache {
			if len(a.cache) < credCacheMax {
				break
			}
			delete(a.cache, k) // an arbitrary one: it is only re-checked
		}
	}
	a.cache[key] = credEntry{hash: u.PasswordHash, expires: now.Add(credCacheTTL)}
}

// failDelay is how long an attempt from src waits before its check:
// nothing for the first failFree failures, then doubling from
// failDelayBase up to failDelayMax.
func (a *authenticator) failDelay(src string) time.Duration {
	now := a.now()
	a.failMu.Lock()
	f, ok := a.fails[src]
	a.failMu.Unlock()
	if !ok || now.Sub(f.last) > failWindow || f.n < failFree {
		return 0
	}
	shift := min(f.n-failFree, 16)
	return min(failDelayBase<<shift, failDelayMax)
}

func (a *authenticator) recordFailure(src string) {
	now := a.now()
	a.failMu.Lock()
	defer a.failMu.Unlock()
	f, ok := a.fails[src]
	if !ok && len(a.fails) >= failSourcesMax {
		for k := range a.fails {
			delete(a.fails, k) // an arbitrary source forgets its penalty
			break
		}
	}
	if ok && now.Sub(f.last) > failWindow {
		f.n = 0
	}
	f.n++
	f.last = now
	a.fails[src] = f
}

// refused logs a failed login, at most 5 lines a second with the count
// of those left out.
func (a *authenticator) refused(user, remote, reason string) {
	if ok, n := a.failLog.Allow(a.now()); ok {
		if len(user) > 64 {
			user = user[:64] + "…"
		}
		a.log.Warn("login failed", "user", user, "source", sourceHost(remote), "reason", reason, "suppressed_since_last", n)
	}
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
