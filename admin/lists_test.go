package admin_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/netio/warrentest"
)

// At most admin's maxWholeLists whole lists are built at once: with every slot
// taken (as by lists being built) a list request waits, then gets 503
// naming the bound, and builds nothing; a slot freed, it is answered.
// Every list path goes through the bound; one resource's GET does not.
func TestWholeListsBounded(t *testing.T) {
	a, get := listsAPI(t)
	paths := []string{"/api/queues", "/api/queues?page=1", "/api/exchanges", "/api/bindings", "/api/bindings/%2F", "/api/connections", "/api/channels"}
	a.HoldWholeLists(admin.MaxWholeLists)
	for _, p := range paths {
		code, body := get(p)
		var e admin.ErrorBody
		if code != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &e) != nil || !strings.Contains(e.Error.Message, "at most 2 whole lists") {
			t.Fatalf("GET %s with every list slot taken: %d %s, want 503 naming the bound", p, code, body)
		}
	}
	if code, body := get("/api/exchanges/amq.direct"); code != 200 {
		t.Fatalf("one exchange's GET with every list slot taken: %d %s", code, body)
	}
	a.ReleaseWholeList()
	for _, p := range paths {
		if code, body := get(p); code != 200 {
			t.Fatalf("GET %s with a slot free: %d %s", p, code, body)
		}
	}
	if n := a.WholeListsHeld(); n != admin.MaxWholeLists-1 {
		t.Fatalf("%d slots taken after the lists were answered, want the test's %d", n, admin.MaxWholeLists-1)
	}
}

// The answers built and not yet written hold at most admin's
// maxListBytes: with the budget full (as by answers a slow client has not
// read), a list is built but refused 503 naming the bound, and its build
// slot is given back; with the budget free the same list is answered and
// its bytes given back once written.
func TestListBytesBounded(t *testing.T) {
	a, get := listsAPI(t)
	a.HoldListBytes(admin.MaxListBytes)
	code, body := get("/api/exchanges")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "not yet read by their clients") {
		t.Fatalf("a list with the answers' budget full: %d %s, want 503 naming the bound", code, body)
	}
	if n := a.WholeListsHeld(); n != 0 {
		t.Fatalf("%d build slots held after the refusal", n)
	}
	a.GiveListBytes(admin.MaxListBytes)
	if code, body := get("/api/exchanges"); code != 200 || !strings.Contains(body, "amq.direct") {
		t.Fatalf("a list with the budget free: %d %s", code, body)
	}
	if n := a.ListBytesHeld(); n != 0 {
		t.Fatalf("%d bytes held after the answer was written", n)
	}
}

// listsAPI is an admin API on a broker of its own, waiting 20 ms for a
// list's slot or bytes, and get, a GET as guest from loopback.
func listsAPI(t *testing.T) (*admin.API, func(path string) (int, string)) {
	srv := warrentest.StartServer(t, nil)
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, time.Hour)
	t.Cleanup(a.Close)
	a.SetListWait(20 * time.Millisecond)
	return a, func(path string) (int, string) {
		t.Helper()
		req := httptest.NewRequest("GET", path, nil)
		req.SetBasicAuth("guest", "guest")
		req.RemoteAddr = "127.0.0.1:1"
		rec := httptest.NewRecorder()
		a.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
}
