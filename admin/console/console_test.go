package console_test

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/admin/console"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

type env struct {
	srv      *netio.Server
	c        *console.Console
	hs       *httptest.Server
	diskFree atomic.Int64 // what the server reads as the data directory's free space
}

var (
	sharedOnce sync.Once
	shared     *env
	sharedStop func()
)

// TestMain stops the broker the console tests share.
func TestMain(m *testing.M) {
	code := m.Run()
	if sharedStop != nil {
		sharedStop()
	}
	os.Exit(code)
}

// start returns the broker, admin API and console the tests share (one
// start-up, not one per test) where what they leave behind does not
// matter to them, run again (go test -count); TestCSRF and TestBrowser
// start their own (startEnv).
func start(t testing.TB) *env {
	sharedOnce.Do(func() {
		var cleanups []func()
		tb := &cleanupTB{TB: t, add: func(f func()) { cleanups = append(cleanups, f) }}
		shared = startEnv(tb)
		sharedStop = func() {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	})
	return shared
}

// cleanupTB keeps the cleanups of the shared environment for TestMain
// instead of the first test that asks for it.
type cleanupTB struct {
	testing.TB
	add func(func())
}

func (c *cleanupTB) Cleanup(f func()) { c.add(f) }
func (c *cleanupTB) TempDir() string {
	d, err := os.MkdirTemp("", "console-test")
	if err != nil {
		c.Fatal(err)
	}
	c.add(func() { os.RemoveAll(d) })
	return d
}

func startEnv(t testing.TB) *env {
	pw, _ := netio.HashPassword("viewer-pw")
	e := &env{}
	e.diskFree.Store(10 << 30)
	srv := warrentest.StartServer(t, &netio.Config{Users: []netio.User{{Name: "viewer", PasswordHash: pw}},
		TickInterval: 20 * time.Millisecond, DiskFreeLimit: 1 << 30, DiskCheckInterval: time.Millisecond,
		DiskFree: func() (int64, bool) { return e.diskFree.Load(), true }}) // faked: the browser test raises the disk alarm
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, 100*time.Millisecond)
	t.Cleanup(a.Close)
	a.SetDataDir(t.TempDir())
	c := console.New(a, warrentest.AdminConnections(srv))
	hs := httptest.NewServer(c)
	t.Cleanup(hs.Close)
	e.srv, e.c, e.hs = srv, c, hs
	return e
}

func (e *env) req(t *testing.T, cl *http.Client, method, path, body string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, e.hs.URL+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// login logs in and returns the client (with the cookie) and the CSRF token.
func (e *env) login(t *testing.T, user, pass string) (*http.Client, string, *http.Response) {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	cl := &http.Client{Jar: jar}
	resp, body := e.req(t, cl, "POST", "/console/api/login", `{"user":"`+user+`","password":"`+pass+`"}`, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("login %s: %d %s", user, resp.StatusCode, body)
	}
	i := strings.Index(body, `"csrf_token":"`)
	tok := body[i+len(`"csrf_token":"`):]
	return cl, tok[:strings.IndexByte(tok, '"')], resp
}

// TestSessionCookie: a login sets a session cookie that scripts cannot
// read and that browsers send only from the console's own pages.
func TestSessionCookie(t *testing.T) {
	e := start(t)
	_, _, resp := e.login(t, "guest", "guest")
	var ck *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == console.CookieName {
			ck = c
		}
	}
	if ck == nil || !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != "/" || len(ck.Value) < 40 {
		t.Fatalf("session cookie %+v (Set-Cookie %q)", ck, resp.Header.Values("Set-Cookie"))
	}
	// Bad credentials get no session.
	resp, _ = e.req(t, http.DefaultClient, "POST", "/console/api/login", `{"user":"guest","password":"nope"}`, nil)
	if resp.StatusCode != 401 || len(resp.Cookies()) != 0 {
		t.Fatalf("bad login: %d %v", resp.StatusCode, resp.Cookies())
	}
	// A form post (what a cross-site page can send without CORS) is refused.
	req, _ := http.NewRequest("POST", e.hs.URL+"/console/api/login", strings.NewReader("user=guest&password=guest"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("form login: %v %v", r, err)
	}
}

// TestCSRF: with a session, a write without the session's CSRF token (or
// with another's) is refused and changes nothing; with it, it is done.
// Reads need no token.
func TestCSRF(t *testing.T) {
	e := startEnv(t) // its own: the queue it declares must not exist before
	cl, tok, _ := e.login(t, "guest", "guest")
	_, other, _ := e.login(t, "guest", "guest")
	for _, hdr := range []map[string]string{nil, {console.CSRFHeader: other}, {console.CSRFHeader: tok + "x"}} {
		resp, body := e.req(t, cl, "PUT", "/api/queues/csrf.q", `{}`, hdr)
		if resp.StatusCode != 403 || !strings.Contains(body, "CSRF") {
			t.Fatalf("write with %v: %d %s", hdr, resp.StatusCode, body)
		}
	}
	if _, ok := e.srv.Queue("csrf.q"); ok {
		t.Fatal("a write without the CSRF token declared the queue")
	}
	if resp, body := e.req(t, cl, "PUT", "/api/queues/csrf.q", `{}`, map[string]string{console.CSRFHeader: tok}); resp.StatusCode != 200 {
		t.Fatalf("write with the token: %d %s", resp.StatusCode, body)
	}
	if resp, _ := e.req(t, cl, "GET", "/api/queues/csrf.q", ``, nil); resp.StatusCode != 200 {
		t.Fatalf("read: %d", resp.StatusCode)
	}
	// Logging out needs the token too, then the session is gone.
	if resp, _ := e.req(t, cl, "POST", "/console/api/logout", ``, nil); resp.StatusCode != 403 {
		t.Fatalf("logout without token: %d", resp.StatusCode)
	}
	if resp, _ := e.req(t, cl, "POST", "/console/api/logout", ``, map[string]string{console.CSRFHeader: tok}); resp.StatusCode != 204 {
		t.Fatalf("logout: %d", resp.StatusCode)
	}
	if resp, _ := e.req(t, cl, "GET", "/api/queues/csrf.q", ``, nil); resp.StatusCode != 401 {
		t.Fatalf("after logout: %d", resp.StatusCode)
	}
	// A viewer's session reads but does not write, token or not.
	vc, vtok, _ := e.login(t, "viewer", "viewer-pw")
	if resp, _ := e.req(t, vc, "DELETE", "/api/queues/csrf.q", ``, map[string]string{console.CSRFHeader: vtok}); resp.StatusCode != 403 {
		t.Fatalf("viewer delete: %d", resp.StatusCode)
	}
	// Basic credentials still work without a session.
	req, _ := http.NewRequest("GET", e.hs.URL+"/api/overview", nil)
	req.SetBasicAuth("guest", "guest")
	if r, err := http.DefaultClient.Do(req); err != nil || r.StatusCode != 200 {
		t.Fatalf("basic auth: %v %v", r, err)
	}
}

// TestSessionsBounded: sessions expire, and logins past the bound end the
// oldest rather than growing the table (the bound lowered from
// MaxSessions to 16, so the test makes few logins).
func TestSessionsBounded(t *testing.T) {
	e := start(t)
	const bound = 16
	e.c.SetMaxSessions(bound)
	now := time.Unix(1_000_000, 0)
	e.c.SetClock(func() time.Time { return now })
	t.Cleanup(func() { e.c.SetMaxSessions(console.MaxSessions); e.c.SetClock(time.Now) })
	first, _, _ := e.login(t, "guest", "guest")
	for range bound + 10 {
		now = now.Add(time.Millisecond)
		e.login(t, "guest", "guest")
	}
	if n := e.c.Sessions(); n != bound {
		t.Fatalf("%d sessions kept, want the bound %d", n, bound)
	}
	if resp, _ := e.req(t, first, "GET", "/api/overview", ``, nil); resp.StatusCode != 401 {
		t.Fatalf("the oldest session survived: %d", resp.StatusCode)
	}
	last, _, _ := e.login(t, "guest", "guest")
	now = now.Add(console.SessionTTL)
	if resp, _ := e.req(t, last, "GET", "/api/overview", ``, nil); resp.StatusCode != 401 {
		t.Fatalf("an expired session still works: %d", resp.StatusCode)
	}
}

// TestAssets: the console is served from the binary, compressed, with a
// content security policy that loads nothing from elsewhere.
func TestAssets(t *testing.T) {
	e := start(t)
	for _, p := range []string{"/", "/app.js", "/app.css", "/vendor/uPlot.iife.min.js", "/vendor/uPlot.min.css", "/vendor/uPlot.LICENSE"} {
		resp, body := e.req(t, http.DefaultClient, "GET", p, "", nil)
		if resp.StatusCode != 200 || len(body) == 0 {
			t.Fatalf("%s: %d", p, resp.StatusCode)
		}
		if p == "/" && (!strings.Contains(resp.Header.Get("Content-Security-Policy"), "default-src 'self'") || strings.Contains(body, "http")) {
			t.Fatalf("index: CSP %q; body loads from elsewhere? %s", resp.Header.Get("Content-Security-Policy"), body)
		}
	}
	if resp, _ := e.req(t, http.DefaultClient, "GET", "/nothing.js", "", nil); resp.StatusCode != 404 {
		t.Fatalf("missing asset: %d", resp.StatusCode)
	}
	tr := &http.Transport{DisableCompression: true}
	req, _ := http.NewRequest("GET", e.hs.URL+"/vendor/uPlot.iife.min.js", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip: %v %v", resp, err)
	}
	resp.Body.Close()
}
