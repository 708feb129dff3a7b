package admin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
	"github.com/warren-mq/warren/wire"
	"golang.org/x/crypto/bcrypt"
)

type env struct {
	t   *testing.T
	srv *netio.Server
	api *httptest.Server
}

func setup(t *testing.T) *env {
	// Hashes at bcrypt's lowest cost: the default one takes seconds per
	// check under the race detector on a busy machine.
	pw, _ := bcrypt.GenerateFromPassword([]byte("viewer-pw"), bcrypt.MinCost)
	srv := warrentest.StartServer(t, &netio.Config{Users: []netio.User{{Name: "viewer", PasswordHash: string(pw)}}})
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, 50*time.Millisecond)
	a.PasswordCost = bcrypt.MinCost
	t.Cleanup(a.Close)
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)
	return &env{t: t, srv: srv, api: hs}
}

// do sends a request as guest (an administrator from loopback) and
// decodes the JSON reply into out (if non-nil); it returns the status.
func (e *env) do(method, path, body string, out any) int {
	return e.doAs("guest", "guest", method, path, body, out)
}

func (e *env) doAs(user, pass, method, path, body string, out any) int {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.api.URL+path, strings.NewReader(body))
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			e.t.Fatalf("%s %s: bad JSON %q: %v", method, path, b, err)
		}
	}
	return resp.StatusCode
}

func (e *env) errCode(method, path, body string) (int, string) {
	e.t.Helper()
	var eb admin.ErrorBody
	st := e.do(method, path, body, &eb)
	return st, eb.Error.Name
}

func TestTopologyCRUD(t *testing.T) {
	e := setup(t)
	var ex map[string]any
	if st := e.do("PUT", "/api/exchanges/events", `{"type":"topic","durable":true,"alternate_exchange":"unrouted"}`, &ex); st != 200 || ex["type"] != "topic" {
		t.Fatalf("put exchange: %d %v", st, ex)
	}
	var q map[string]any
	body := `{"durable":true,"max_priority":9,"max_length":1000,"max_length_bytes":1048576,"overflow":"reject-publish",
		"message_ttl_ms":60000,"expires_ms":3600000,"dead_letter_exchange":"dlx","dead_letter_routing_key":"dead",
		"delivery_limit":5,"retry_initial_ms":100,"retry_multiplier":2.5,"retry_max_ms":10000,"consumer_timeout_ms":30000}`
	if st := e.do("PUT", "/api/queues/orders", body, &q); st != 200 {
		t.Fatalf("put queue: %d %v", st, q)
	}
	for k, want := range map[string]any{"max_priority": 9.0, "overflow": "reject-publish", "retry_multiplier": 2.5, "delivery_limit": 5.0, "durable": true} {
		if q[k] != want {
			t.Errorf("queue %s = %v, want %v", k, q[k], want)
		}
	}
	if st := e.do("PUT", "/api/bindings", `{"exchange":"events","queue":"orders","routing_key":"order.*.created"}`, nil); st != 200 {
		t.Fatalf("bind: %d", st)
	}
	var bs []map[string]any
	e.do("GET", "/api/bindings", "", &bs)
	if len(bs) != 1 || bs[0]["routing_key"] != "order.*.created" || bs[0]["queue"] != "orders" {
		t.Fatalf("bindings %v", bs)
	}
	var qs []map[string]any
	e.do("GET", "/api/queues", "", &qs)
	if len(qs) != 1 || qs[0]["name"] != "orders" || qs[0]["ready"] != 0.0 || qs[0]["rates"] == nil {
		t.Fatalf("queues %v", qs)
	}
	var exs []map[string]any
	e.do("GET", "/api/exchanges", "", &exs)
	if len(exs) < 5 {
		t.Fatalf("exchanges %v", exs)
	}
	if st := e.do("DELETE", "/api/bindings", `{"exchange":"events","queue":"orders","routing_key":"order.*.created"}`, nil); st != 204 {
		t.Fatalf("unbind: %d", st)
	}
	if st := e.do("DELETE", "/api/queues/orders", "", nil); st != 200 {
		t.Fatalf("delete queue: %d", st)
	}
	if st := e.do("DELETE", "/api/exchanges/events", "", nil); st != 204 {
		t.Fatalf("delete exchange: %d", st)
	}
	if st, name := e.errCode("GET", "/api/queues/orders", ""); st != 404 || name != "not_found" {
		t.Fatalf("deleted queue: %d %s", st, name)
	}
}

func TestBadInputIsRefusedWhole(t *testing.T) {
	e := setup(t)
	cases := []struct {
		method, path, body string
		status             int
		name               string
	}{
		{"PUT", "/api/queues/q", `{"max_priority":"high"}`, 400, "invalid_argument"},
		{"PUT", "/api/queues/q", `{"max_lenght":5}`, 400, "invalid_argument"},
		{"PUT", "/api/queues/q", `{"max_priority":300}`, 400, "invalid_argument"},
		{"PUT", "/api/queues/q", `{"overflow":"explode"}`, 400, "invalid_argument"},
		{"PUT", "/api/queues/q", `{}{}`, 400, "invalid_argument"},
		{"PUT", "/api/exchanges/x", `{"type":"nope"}`, 400, "invalid_argument"},
		{"PUT", "/api/exchanges/x", ``, 400, "invalid_argument"},
		{"PUT", "/api/bindings", `{"exchange":"amq.topic","routing_key":"a"}`, 400, "invalid_argument"},
		{"PUT", "/api/bindings", `{"exchange":"amq.topic","queue":"missing","routing_key":"a"}`, 404, "not_found"},
		{"PUT", "/api/bindings", `{"exchange":"amq.topic","queue":"missing","routing_key":"` + strings.Repeat("a", 256) + `"}`, 400, "invalid_argument"},
		// An argument key over 255 bytes (JSON has no bound; the tables
		// have): the handler panicked encoding it.
		{"PUT", "/api/exchanges/x", `{"type":"headers","arguments":{"` + strings.Repeat("k", 256) + `":1}}`, 400, "invalid_argument"},
		{"PUT", "/api/bindings", `{"exchange":"amq.headers","queue":"q0","arguments":{"` + strings.Repeat("k", 256) + `":1}}`, 400, "invalid_argument"},
		{"DELETE", "/api/bindings", `{"exchange":"amq.headers","queue":"q0","arguments":{"` + strings.Repeat("k", 256) + `":1}}`, 400, "invalid_argument"},
		// A routing key over 255 bytes: a dead letter of it panicked the
		// broker (PublishOne refuses it).
		{"POST", "/api/exchanges/amq.direct/publish", `{"routing_key":"` + strings.Repeat("r", 256) + `","payload":"m"}`, 400, "invalid_argument"},
		// Properties the property block cannot hold: the handler
		// panicked encoding them.
		{"POST", "/api/exchanges/amq.direct/publish", `{"routing_key":"r","payload":"m","properties":{"content_type":"` + strings.Repeat("c", 65536) + `"}}`, 400, "invalid_argument"},
		{"POST", "/api/exchanges/amq.direct/publish", `{"routing_key":"r","payload":"m","properties":{"headers":[{"Key":"k","Value":{"Kind":99}}]}}`, 400, "invalid_argument"},
		{"POST", "/api/exchanges/amq.direct/publish", `{"routing_key":"r","payload":"m","properties":{"deaths":[` + strings.Repeat(`{"queue":"q","reason":1},`, 255) + `{"queue":"q","reason":1}]}}`, 400, "invalid_argument"},
		{"GET", "/api/queues/missing", ``, 404, "not_found"},
		{"POST", "/api/queues/missing/purge", ``, 404, "not_found"},
		{"POST", "/api/queues/missing/get", `{"count":1}`, 404, "not_found"},
		{"POST", "/api/queues/missing/replay", ``, 404, "not_found"},
		{"DELETE", "/api/connections/abc", ``, 400, "invalid_argument"},
		{"DELETE", "/api/connections/999", ``, 404, "not_found"},
		{"DELETE", "/api/exchanges/amq.direct", ``, 403, "not_allowed"},
		{"GET", "/api/nothing", ``, 404, "not_found"},
	}
	for _, c := range cases {
		st, name := e.errCode(c.method, c.path, c.body)
		if st != c.status || name != c.name {
			t.Errorf("%s %s %s: got %d %s, want %d %s", c.method, c.path, c.body, st, name, c.status, c.name)
		}
	}
	// Nothing was half-applied.
	if _, ok := e.srv.Queue("q"); ok {
		t.Fatal("a refused declare created the queue")
	}
	// A conflicting redeclare is refused.
	e.do("PUT", "/api/queues/q", `{"max_length":5}`, nil)
	if st, name := e.errCode("PUT", "/api/queues/q", `{"max_length":6}`); st != 409 || name != "precondition_failed" {
		t.Fatalf("redeclare: %d %s", st, name)
	}
}

func TestAuth(t *testing.T) {
	e := setup(t)
	if st := e.doAs("", "", "GET", "/api/overview", "", nil); st != 401 {
		t.Fatalf("no credentials: %d", st)
	}
	if st := e.doAs("guest", "wrong", "GET", "/api/overview", "", nil); st != 401 {
		t.Fatalf("wrong password: %d", st)
	}
	var o map[string]any
	if st := e.doAs("viewer", "viewer-pw", "GET", "/api/overview", "", &o); st != 200 || o["version"] == nil {
		t.Fatalf("viewer read: %d %v", st, o)
	}
	var eb admin.ErrorBody
	if st := e.doAs("viewer", "viewer-pw", "PUT", "/api/queues/q", `{}`, &eb); st != 403 || eb.Error.Name != "access_refused" {
		t.Fatalf("viewer write: %d %+v", st, eb)
	}
}

func publish(t *testing.T, ch *client.Channel, rk string, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := 0; i < n; i++ {
		if _, err := ch.PublishAsync(ctx, "", client.Message{RoutingKey: rk, Body: []byte{byte('a' + i)}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestDeadLetterInspectAndReplay: messages rejected into a dead-letter
// queue are inspected with their history, replayed to where they died
// from, and consumed there; nothing is lost.
func TestDeadLetterInspectAndReplay(t *testing.T) {
	e := setup(t)
	for _, r := range []struct{ path, body string }{
		{"/api/exchanges/dlx", `{"type":"fanout"}`},
		{"/api/queues/orders.dlq", `{}`},
		{"/api/queues/orders", `{"dead_letter_exchange":"dlx"}`},
	} {
		if st := e.do("PUT", r.path, r.body, nil); st != 200 {
			t.Fatalf("%s: %d", r.path, st)
		}
	}
	e.do("PUT", "/api/bindings", `{"exchange":"dlx","queue":"orders.dlq","routing_key":""}`, nil)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(e.srv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, _ := c.Channel(ctx)
	publish(t, ch, "orders", 5)
	cs, _ := ch.Consume(ctx, "orders", client.ConsumeOptions{Prefetch: 10})
	for i := 0; i < 5; i++ {
		(<-cs.Deliveries()).Reject()
	}
	expectReady(t, e.srv, ch, "orders.dlq", 5)

	var got struct{ Messages []broker.Message }
	if st := e.do("POST", "/api/queues/orders.dlq/get", `{"count":3}`, &got); st != 200 || len(got.Messages) != 3 {
		t.Fatalf("get: %d %+v", st, got)
	}
	m := got.Messages[0]
	if string(m.Body) != "a" || m.Properties == nil || len(m.Properties.Deaths) != 1 || m.Properties.Deaths[0].Queue != "orders" ||
		m.Properties.Deaths[0].Reason != wire.ReasonRejected || m.Properties.Deaths[0].RoutingKeys[0] != "orders" {
		t.Fatalf("inspected %+v", m)
	}
	expectReady(t, e.srv, nil, "orders.dlq", 5) // inspection took nothing

	var res admin.ReplayResult
	if st := e.do("POST", "/api/queues/orders.dlq/replay", `{"count":5,"rate":1000}`, &res); st != 200 || res.Moved != 5 {
		t.Fatalf("replay: %d %+v", st, res)
	}
	expectReady(t, e.srv, nil, "orders.dlq", 0)
	var bodies []string
	for i := 0; i < 5; i++ {
		select {
		case d := <-cs.Deliveries():
			bodies = append(bodies, string(d.Body))
			d.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("replayed messages not back in orders; got %v", bodies)
		}
	}
	if strings.Join(bodies, "") != "abcde" {
		t.Fatalf("replayed %v", bodies)
	}
}

func TestReplayOfUnroutableLeavesTheMessage(t *testing.T) {
	e := setup(t)
	e.do("PUT", "/api/exchanges/dlx", `{"type":"fanout"}`, nil)
	e.do("PUT", "/api/queues/dlq", `{}`, nil)
	e.do("PUT", "/api/queues/work", `{"dead_letter_exchange":"dlx"}`, nil)
	e.do("PUT", "/api/bindings", `{"exchange":"dlx","queue":"dlq","routing_key":""}`, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _ := client.Dial(ctx, warrentest.URL(e.srv))
	defer c.Close()
	ch, _ := c.Channel(ctx)
	publish(t, ch, "work", 1)
	cs, _ := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 1})
	(<-cs.Deliveries()).Reject()
	cs.Cancel(ctx)
	expectReady(t, e.srv, ch, "dlq", 1)
	e.do("DELETE", "/api/queues/work", "", nil) // the origin is gone
	var res map[string]any
	st := e.do("POST", "/api/queues/dlq/replay", ``, &res)
	if st == 200 {
		t.Fatalf("replay into nowhere succeeded: %v", res)
	}
	expectReady(t, e.srv, nil, "dlq", 1)
}

// expectReady checks that queue q holds n ready messages and none
// unacked once everything before the call has been applied: a round trip
// on ch (nil: none; the broker reads a connection's frames in order and
// hands each one's work to the shards before it answers a later request,
// and the client sends its batched settlements before any request), then
// the shards' barrier twice (the second round applies the dead letters the
// first one's work sent on). No polling: the state is read once.
func expectReady(t *testing.T, srv *netio.Server, ch *client.Channel, q string, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ch != nil {
		if err := ch.DeclareExchange(ctx, "amq.direct", "direct", client.ExchangeOptions{Passive: true}); err != nil {
			t.Fatalf("round trip: %v", err)
		}
	}
	for range 2 {
		if err := srv.Barrier(ctx); err != nil {
			t.Fatalf("broker barrier: %v", err)
		}
	}
	info, _ := srv.Queue(q)
	if info.Ready != n || info.Unacked != 0 {
		t.Fatalf("queue %s: ready %d unacked %d, want ready %d", q, info.Ready, info.Unacked, n)
	}
}

func TestConnectionsAndOverview(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, _ := client.Dial(ctx, warrentest.URL(e.srv))
	var conns []admin.Connection
	e.do("GET", "/api/connections", "", &conns)
	if len(conns) != 1 || conns[0].User != "guest" {
		t.Fatalf("connections %+v", conns)
	}
	if st := e.do("DELETE", "/api/connections/"+jsonNum(conns[0].ID), "", nil); st != 204 {
		t.Fatalf("close: %d", st)
	}
	select {
	case <-c.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("connection not closed")
	}
	var o api.Overview
	e.do("GET", "/api/overview", "", &o)
	if o.Version == "" || o.Exchanges < 4 {
		t.Fatalf("overview %+v", o)
	}
}

func jsonNum(v uint64) string { b, _ := json.Marshal(v); return string(bytes.TrimSpace(b)) }

// TestPeekIsBoundedInBytes: /get returns at most count messages and stops
// at the first whose body would take the copied bodies past 16 MiB (always
// at least one). Before, count 10,000 copied all of them on the queue's
// shard whatever their size (10,000 of 4 MiB: 40 GB in one answer).
func TestPeekIsBoundedInBytes(t *testing.T) {
	e := setup(t)
	if st := e.do("PUT", "/api/queues/big", `{}`, nil); st != 200 {
		t.Fatal(st)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(e.srv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, err := c.Channel(ctx)
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 3<<20)
	for i := 0; i < 7; i++ { // 21 MiB
		if _, err := ch.PublishAsync(ctx, "", client.Message{RoutingKey: "big", Body: body}); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.WaitConfirms(ctx); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if st := e.do("POST", "/api/queues/big/get", `{"count":10}`, &got); st != 200 {
		t.Fatal(st)
	}
	if len(got.Messages) != 5 {
		t.Fatalf("peek of 10 with 7 ready messages of 3 MiB: %d messages, want 5 (15 MiB; a sixth would pass 16)", len(got.Messages))
	}
	var one struct {
		Messages []json.RawMessage `json:"messages"`
	}
	if st := e.do("POST", "/api/queues/big/get", `{"count":1}`, &one); st != 200 || len(one.Messages) != 1 {
		t.Fatalf("peek of 1: %d, %d messages", st, len(one.Messages))
	}
}
