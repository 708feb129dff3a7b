package admin_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/netio/warrentest"
)

// serve runs one request through the API in process, from remote.
func serve(t *testing.T, a *admin.API, method, path string, body io.Reader, remote string) (*httptest.ResponseRecorder, admin.ErrorBody) {
	t.Helper()
	req := httptest.NewRequest(method, path, body)
	req.RemoteAddr = remote
	req.SetBasicAuth("guest", "guest")
	rec := httptest.NewRecorder()
	a.ServeHTTP(rec, req)
	var eb admin.ErrorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &eb)
	return rec, eb
}

// letters is a body of n bytes of 'a' that is never held in memory.
type letters struct{ n int64 }

func (z *letters) Read(p []byte) (int, error) {
	if z.n <= 0 {
		return 0, io.EOF
	}
	k := min(int64(len(p)), z.n)
	for i := range p[:k] {
		p[i] = 'a'
	}
	z.n -= k
	return int(k), nil
}

func TestErrorsSayWhatToDo(t *testing.T) {
	srv := warrentest.StartServer(t, nil)
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, 0)
	defer a.Close()

	// A body over the limit is 413 and says the limit, not "unexpected EOF".
	rec, eb := serve(t, a, "PUT", "/api/queues/big", io.MultiReader(strings.NewReader(`{"dead_letter_exchange": "`), &letters{100 << 20}, strings.NewReader(`"}`)), "127.0.0.1:40000")
	if rec.Code != http.StatusRequestEntityTooLarge || !strings.Contains(eb.Error.Message, "1 MiB") {
		t.Errorf("100 MB body: %d %+v", rec.Code, eb.Error)
	}
	// A method the path does not take is 405 with Allow, not 404.
	rec, _ = serve(t, a, "PATCH", "/api/queues/q", strings.NewReader(`{}`), "127.0.0.1:40000")
	if rec.Code != http.StatusMethodNotAllowed || !strings.Contains(rec.Header().Get("Allow"), "PUT") {
		t.Errorf("PATCH: %d, Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
	// guest from a remote address: say guest is loopback-only.
	rec, eb = serve(t, a, "GET", "/api/overview", nil, "192.0.2.7:40000")
	if rec.Code != http.StatusUnauthorized || !strings.Contains(eb.Error.Message, "loopback") {
		t.Errorf("guest from remote: %d %+v", rec.Code, eb.Error)
	}
}
