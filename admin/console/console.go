// Package console is Warren's web console: a small single-page app,
// embedded in the binary, served on warrend's HTTP port at /, that talks
// to the admin API (package admin) as a logged-in user.
//
// A login (POST /console/api/login, the broker's users and passwords)
// opens a session: a random id in a cookie that scripts cannot read
// (HttpOnly) and that browsers send only from Warren's own pages
// (SameSite=Strict), and a CSRF token that the app sends back in the
// X-CSRF-Token header on every write; a write without it is refused. The
// sessions are bounded (MaxSessions; the oldest goes first) and expire
// (SessionTTL). Requests with HTTP Basic credentials reach the admin API
// as before.
package console

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/wire"
)

//go:embed assets
var assets embed.FS

const (
	// CookieName is the session cookie's name.
	CookieName = "warren_session"
	// CSRFHeader carries the session's CSRF token on writes.
	CSRFHeader = "X-CSRF-Token"
	// MaxSessions bounds the sessions kept: a login past it ends the
	// session closest to expiry.
	MaxSessions = 1024
	// SessionTTL is how long a session lasts after its login.
	SessionTTL = 12 * time.Hour
)

type session struct {
	user    string
	csrf    string
	expires time.Time
}

// Console serves the web console and, for its sessions, the admin API.
type Console struct {
	api   *admin.API
	conns admin.Connections
	now   func() time.Time

	mu          sync.Mutex
	sessions    map[string]*session // by the cookie's value
	maxSessions int

	files map[string]*asset
}

type asset struct {
	body, gz []byte
	ctype    string
	etag     string
}

// New returns the console for api, whose users conns authenticates.
func New(api *admin.API, conns admin.Connections) *Console {
	c := &Console{api: api, conns: conns, now: time.Now, sessions: map[string]*session{}, maxSessions: MaxSessions, files: map[string]*asset{}}
	_ = fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, _ := assets.ReadFile(p)
		sum := sha256.Sum256(b)
		a := &asset{body: b, etag: `"` + hex.EncodeToString(sum[:8]) + `"`, ctype: mime.TypeByExtension(path.Ext(p))}
		if a.ctype == "" {
			a.ctype = "application/octet-stream"
		}
		var z bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		if z.Len() < len(b) {
			a.gz = z.Bytes()
		}
		c.files[strings.TrimPrefix(p, "assets")] = a
		return nil
	})
	return c
}

// SetMaxSessions lowers (or raises) the bound on sessions (tests).
func (c *Console) SetMaxSessions(n int) {
	c.mu.Lock()
	c.maxSessions = max(1, n)
	c.mu.Unlock()
}

// SetClock replaces the clock sessions expire by (tests).
func (c *Console) SetClock(now func() time.Time) { c.now = now }

// Sessions is the number of sessions kept.
func (c *Console) Sessions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sessions)
}

// ServeHTTP serves the console's pages and login, and the admin API (/api/)
// for a session or for HTTP Basic credentials.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case strings.HasPrefix(r.URL.Path, "/api/"):
		c.serveAPI(w, r)
	case r.URL.Path == "/console/api/login":
		c.login(w, r)
	case r.URL.Path == "/console/api/logout":
		c.logout(w, r)
	case r.URL.Path == "/console/api/session":
		// Not logged in is an answer, not an error: {"user": ""}.
		s, _ := c.session(r)
		c.writeSession(w, s)
	default:
		c.static(w, r)
	}
}

func (c *Console) serveAPI(w http.ResponseWriter, r *http.Request) {
	if _, _, basic := r.BasicAuth(); basic {
		c.api.ServeHTTP(w, r)
		return
	}
	if _, err := r.Cookie(CookieName); err != nil {
		c.api.ServeHTTP(w, r) // answers 401 with the Basic challenge
		return
	}
	s, ok := c.session(r)
	if !ok {
		writeErr(w, http.StatusUnauthorized, wire.AuthFailed, "the console session has expired: log in again")
		return
	}
	if !safeMethod(r.Method) && !c.csrfOK(r, s) {
		writeErr(w, http.StatusForbidden, wire.AccessRefused, "missing or wrong "+CSRFHeader+" header: a write from a console session must carry the session's CSRF token")
		return
	}
	c.api.ServeAuthenticated(w, r, s.user)
}

func safeMethod(m string) bool { return m == http.MethodGet || m == http.MethodHead }

func (c *Console) csrfOK(r *http.Request, s session) bool {
	got := r.Header.Get(CSRFHeader)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(s.csrf)) == 1
}

// session returns the live session r's cookie names.
func (c *Console) session(r *http.Request) (session, bool) {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return session{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.sessions[ck.Value]
	if s == nil {
		return session{}, false
	}
	if !c.now().Before(s.expires) {
		delete(c.sessions, ck.Value)
		return session{}, false
	}
	return *s, true
}

type loginBody struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

// SessionInfo answers a login and GET /console/api/session.
type SessionInfo struct {
	User          string `json:"user"`
	CSRFToken     string `json:"csrf_token"`
	Administrator bool   `json:"administrator"`
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeErr(w, http.StatusMethodNotAllowed, wire.NotAllowed, "log in with POST")
		return
	}
	// A JSON body: a cross-site form cannot send one without CORS's
	// preflight, which this server never approves.
	if ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); ct != "application/json" {
		writeErr(w, http.StatusUnsupportedMediaType, wire.InvalidArgument, "send the credentials as application/json: {\"user\":…,\"password\":…}")
		return
	}
	var b loginBody
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&b); err != nil || b.User == "" {
		writeErr(w, http.StatusBadRequest, wire.InvalidArgument, "want {\"user\":…,\"password\":…}")
		return
	}
	if _, ok := c.conns.Authenticate(b.User, b.Password, r.RemoteAddr); !ok {
		writeErr(w, http.StatusUnauthorized, wire.AuthFailed, c.conns.AuthRefusal(b.User, r.RemoteAddr))
		return
	}
	id, csrf := token(), token()
	now := c.now()
	s := &session{user: b.User, csrf: csrf, expires: now.Add(SessionTTL)}
	c.mu.Lock()
	if len(c.sessions) >= c.maxSessions {
		for k, old := range c.sessions {
			if !now.Before(old.expires) {
				delete(c.sessions, k)
			}
		}
	}
	for len(c.sessions) >= c.maxSessions {
		var oldest string
		for k, old := range c.sessions {
			if oldest == "" || old.expires.Before(c.sessions[oldest].expires) {
				oldest = k
			}
		}
		delete(c.sessions, oldest)
	}
	c.sessions[id] = s
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https", MaxAge: int(SessionTTL / time.Second)})
	c.writeSession(w, *s)
}

func (c *Console) writeSession(w http.ResponseWriter, s session) {
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, 200, SessionInfo{User: s.user, CSRFToken: s.csrf, Administrator: s.user != "" && c.conns.AuthorizeOperator(s.user) == nil})
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		writeErr(w, http.StatusMethodNotAllowed, wire.NotAllowed, "log out with POST")
		return
	}
	s, ok := c.session(r)
	if ok && !c.csrfOK(r, s) {
		writeErr(w, http.StatusForbidden, wire.AccessRefused, "missing or wrong "+CSRFHeader+" header")
		return
	}
	if ck, err := r.Cookie(CookieName); err == nil {
		c.mu.Lock()
		delete(c.sessions, ck.Value)
		c.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	w.WriteHeader(http.StatusNoContent)
}

func (c *Console) static(w http.ResponseWriter, r *http.Request) {
	if !safeMethod(r.Method) {
		w.Header().Set("Allow", "GET, HEAD")
		writeErr(w, http.StatusMethodNotAllowed, wire.NotAllowed, r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	p := r.URL.Path
	if p == "/" {
		p = "/index.html"
	}
	a := c.files[p]
	if a == nil {
		http.NotFound(w, r)
		return
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("ETag", a.etag)
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Vary", "Accept-Encoding")
	if p == "/index.html" {
		h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		h.Set("X-Frame-Options", "DENY")
	}
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	body := a.body
	if a.gz != nil && strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		h.Set("Content-Encoding", "gzip")
		body = a.gz
	}
	w.WriteHeader(200)
	if r.Method != http.MethodHead {
		w.Write(body)
	}
}

func token() string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		panic("console: no randomness for a session: " + err.Error())
	}
	return base64.RawURLEncoding.EncodeToString(b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// writeErr answers as the admin API does (admin.ErrorBody).
func writeErr(w http.ResponseWriter, status int, code wire.Code, msg string) {
	var b admin.ErrorBody
	b.Error.Code, b.Error.Name, b.Error.Message = int(code), code.String(), msg
	writeJSON(w, status, b)
}
