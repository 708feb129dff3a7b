package admin_test

import (
	"strings"
	"testing"
)

// Virtual hosts through the admin API: PUT/GET/DELETE /api/vhosts/{name};
// the paths with a vhost (%2F for "/") and their aliases without one for
// "/"; the same queue name in two vhosts is two queues; lists take
// ?vhost=; deleting a vhost deletes what is in it.
func TestVhostsAPI(t *testing.T) {
	e := setup(t)
	var v map[string]any
	if st := e.do("PUT", "/api/vhosts/staging", `{"max_queues":2}`, &v); st != 200 || v["max_queues"] != float64(2) {
		t.Fatalf("put vhost: %d %v", st, v)
	}
	if st := e.doAs("viewer", "viewer-pw", "PUT", "/api/vhosts/x", ``, nil); st != 403 {
		t.Fatalf("a non-administrator made a vhost: %d", st)
	}
	for _, p := range []string{"/api/queues/q", "/api/queues/staging/q", "/api/queues/staging/r"} {
		if st := e.do("PUT", p, `{}`, nil); st != 200 {
			t.Fatalf("PUT %s: %d", p, st)
		}
	}
	if st, name := e.errCode("PUT", "/api/queues/staging/s", `{}`); st != 503 || name != "limit_reached" {
		t.Fatalf("a third queue in staging (max_queues 2): %d %s", st, name)
	}
	if st := e.do("POST", "/api/exchanges/staging/amq.default/publish", `{"routing_key":"q","payload":"x"}`, nil); st != 200 {
		t.Fatalf("publish in staging: %d", st)
	}
	var q map[string]any
	for p, want := range map[string]float64{"/api/queues/q": 0, "/api/queues/%2F/q": 0, "/api/queues/staging/q": 1} {
		if st := e.do("GET", p, "", &q); st != 200 || q["ready"] != want || q["name"] != "q" {
			t.Fatalf("GET %s: %d %v, want ready %v", p, st, q, want)
		}
	}
	var qs []map[string]any
	if st := e.do("GET", "/api/queues?vhost=staging", "", &qs); st != 200 || len(qs) != 2 || qs[0]["name"] != "q" {
		t.Fatalf("list staging: %d %v", st, qs)
	}
	if st := e.do("GET", "/api/queues", "", &qs); st != 200 || len(qs) != 1 {
		t.Fatalf("list /: %d %v", st, qs)
	}
	var exs []map[string]any
	if st := e.do("GET", "/api/exchanges?vhost=staging", "", &exs); st != 200 || len(exs) != 4 {
		t.Fatalf("staging's exchanges (its amq.*): %d %v", st, exs)
	}
	if st := e.do("PUT", "/api/bindings/staging", `{"exchange":"amq.direct","queue":"r","routing_key":"k"}`, nil); st != 200 {
		t.Fatalf("bind in staging: %d", st)
	}
	var bs []map[string]any
	if st := e.do("GET", "/api/bindings/staging", "", &bs); st != 200 || len(bs) != 1 || bs[0]["queue"] != "r" {
		t.Fatalf("staging's bindings: %d %v", st, bs)
	}
	var vs []map[string]any
	if st := e.do("GET", "/api/vhosts", "", &vs); st != 200 || len(vs) != 2 || vs[1]["name"] != "staging" || vs[1]["queues"] != float64(2) {
		t.Fatalf("vhosts: %d %v", st, vs)
	}
	if st := e.do("DELETE", "/api/vhosts/staging", "", nil); st != 204 {
		t.Fatalf("delete vhost: %d", st)
	}
	if st, name := e.errCode("GET", "/api/queues/staging/q", ""); st != 404 || name != "not_found" {
		t.Fatalf("staging's queue after its vhost: %d %s", st, name)
	}
	if st := e.do("GET", "/api/queues/q", "", nil); st != 200 {
		t.Fatalf("/'s queue q went with staging: %d", st)
	}
	if st, name := e.errCode("DELETE", "/api/vhosts/%2F", ""); st != 403 || name != "not_allowed" {
		t.Fatalf("deleting /: %d %s", st, name)
	}
	var eb map[string]map[string]any
	if st := e.do("PUT", "/api/permissions/nope/viewer", `{"configure":".*","write":"","read":""}`, &eb); st != 404 || !strings.Contains(eb["error"]["message"].(string), "nope") {
		t.Fatalf("permissions in a vhost that does not exist: %d %v", st, eb)
	}
}
