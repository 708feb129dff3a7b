package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warren-mq/warren/admin"
	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/client"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

// TestQueuesPaging: GET /api/queues pages, sorts and filters, says how
// many queues there are and how many matched, and refuses bad values with
// a 400 that names the parameter.
func TestQueuesPaging(t *testing.T) {
	e := setup(t)
	for i := range 25 {
		name := fmt.Sprintf("q%02d", i)
		if i%5 == 0 {
			name = fmt.Sprintf("orders.%02d", i)
		}
		if st := e.do("PUT", "/api/queues/"+name, `{}`, nil); st != 200 {
			t.Fatalf("declare %s: %d", name, st)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(e.srv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, _ := c.Channel(ctx)
	publish(t, ch, "q07", 3)
	publish(t, ch, "q13", 5)

	var p api.QueuePage
	if st := e.do("GET", "/api/queues?page=2&page_size=10", "", &p); st != 200 {
		t.Fatalf("page 2: %d", st)
	}
	if p.TotalCount != 25 || p.FilteredCount != 25 || p.Page != 2 || p.PageSize != 10 || p.PageCount != 3 || len(p.Items) != 10 {
		t.Fatalf("page 2: %+v", p)
	}
	if p.Items[0].Name != "q07" { // page 1: orders.00…orders.20 (5), q01…q04, q06: sorted by name
		t.Fatalf("page 2 starts at %s", p.Items[0].Name)
	}
	e.do("GET", "/api/queues?page=1&page_size=2&sort=ready&order=desc", "", &p)
	if len(p.Items) != 2 || p.Items[0].Name != "q13" || p.Items[0].Ready != 5 || p.Items[1].Name != "q07" {
		t.Fatalf("by ready desc: %+v", p.Items)
	}
	e.do("GET", "/api/queues?page=1&page_size=100&name=ORDERS", "", &p)
	if p.TotalCount != 25 || p.FilteredCount != 5 || p.PageCount != 1 || len(p.Items) != 5 || p.Items[4].Name != "orders.20" {
		t.Fatalf("filtered: %+v", p)
	}
	e.do("GET", "/api/queues?page=9&page_size=10", "", &p)
	if len(p.Items) != 0 || p.Items == nil || p.PageCount != 3 {
		t.Fatalf("past the end: %+v", p)
	}
	// Without page parameters: the plain list, as before (warrenctl reads it).
	var all []api.Queue
	if st := e.do("GET", "/api/queues?sort=name&order=desc", "", &all); st != 200 || len(all) != 25 || all[0].Name != "q24" {
		t.Fatalf("plain list: %d %d", st, len(all))
	}
	for _, q := range []string{"page=0", "page=x", "page_size=0", "page_size=501", "sort=colour", "order=up", "pagesize=10", "page=1&page=2"} {
		var eb admin.ErrorBody
		st := e.do("GET", "/api/queues?"+q, "", &eb)
		if st != 400 || eb.Error.Name != "invalid_argument" || !strings.Contains(eb.Error.Message, strings.Split(strings.Split(q, "=")[0], "&")[0]) {
			t.Errorf("?%s: %d %+v", q, st, eb)
		}
	}
}

// TestChannelsListing: GET /api/channels lists each open channel with its
// connection, consumers and unacked deliveries.
func TestChannelsListing(t *testing.T) {
	e := setup(t)
	e.do("PUT", "/api/queues/work", `{}`, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, warrentest.URL(e.srv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, _ := c.Channel(ctx)
	publish(t, ch, "work", 2)
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 10})
	if err != nil {
		t.Fatal(err)
	}
	<-cs.Deliveries()
	<-cs.Deliveries()
	expectUnacked(t, e.srv, ch, "work", 2)
	var chans []api.Channel
	if st := e.do("GET", "/api/channels", "", &chans); st != 200 {
		t.Fatalf("channels: %d", st)
	}
	var conns []api.Connection
	e.do("GET", "/api/connections", "", &conns)
	if len(chans) != 1 || len(conns) != 1 || chans[0].Connection != conns[0].ID || chans[0].User != "guest" ||
		chans[0].Unacked != 2 || len(chans[0].Consumers) != 1 || chans[0].Consumers[0].Queue != "work" || chans[0].Consumers[0].Tag == "" {
		t.Fatalf("channels %+v (connections %+v)", chans, conns)
	}
}

// TestPublishEndpoint: POST /api/exchanges/{name}/publish routes one
// message through the broker and says whether it was routed.
func TestPublishEndpoint(t *testing.T) {
	e := setup(t)
	e.do("PUT", "/api/queues/inbox", `{}`, nil)
	e.do("PUT", "/api/exchanges/events", `{"type":"topic"}`, nil)
	e.do("PUT", "/api/bindings", `{"exchange":"events","queue":"inbox","routing_key":"order.*"}`, nil)
	var res api.PublishResult
	if st := e.do("POST", "/api/exchanges/amq.default/publish", `{"routing_key":"inbox","payload":"hello","properties":{"content_type":"text/plain"}}`, &res); st != 200 || !res.Routed || res.Queues != 1 {
		t.Fatalf("default exchange: %d %+v", st, res)
	}
	if st := e.do("POST", "/api/exchanges/events/publish", `{"routing_key":"order.new","payload":"aGk=","payload_encoding":"base64"}`, &res); st != 200 || !res.Routed {
		t.Fatalf("topic: %d %+v", st, res)
	}
	if st := e.do("POST", "/api/exchanges/events/publish", `{"routing_key":"nothing.here","payload":"x"}`, &res); st != 200 || res.Routed || res.Queues != 0 {
		t.Fatalf("unroutable: %d %+v", st, res)
	}
	expectReady(t, e.srv, nil, "inbox", 2)
	var got api.Messages
	e.do("POST", "/api/queues/inbox/get", `{"count":2}`, &got)
	if len(got.Messages) != 2 || string(got.Messages[0].Body) != "hello" || got.Messages[0].Properties == nil ||
		got.Messages[0].Properties.ContentType != "text/plain" || string(got.Messages[1].Body) != "hi" || got.Messages[1].RoutingKey != "order.new" {
		t.Fatalf("published %+v", got.Messages)
	}
	for _, c := range []struct {
		path, body string
		status     int
		name       string
	}{
		{"/api/exchanges/nope/publish", `{"routing_key":"a","payload":"x"}`, 404, "exchange_not_found"},
		{"/api/exchanges/events/publish", `{"routing_key":"a","payload":"%%%","payload_encoding":"base64"}`, 400, "invalid_argument"},
		{"/api/exchanges/events/publish", `{"routing_key":"a","payload":"x","payload_encoding":"hex"}`, 400, "invalid_argument"},
		{"/api/exchanges/events/publish", `{"routing_key":"a","payload":"x","properties":{"colour":"red"}}`, 400, "invalid_argument"},
	} {
		var eb admin.ErrorBody
		if st := e.do("POST", c.path, c.body, &eb); st != c.status || eb.Error.Name != c.name {
			t.Errorf("%s %s: %d %+v, want %d %s", c.path, c.body, st, eb, c.status, c.name)
		}
	}
	var eb admin.ErrorBody
	if st := e.doAs("viewer", "viewer-pw", "POST", "/api/exchanges/events/publish", `{"routing_key":"order.x","payload":"x"}`, &eb); st != 403 {
		t.Fatalf("viewer publish: %d %+v", st, eb)
	}
}

// TestRedeliverAndDeadLetterRates: the rate sampler reports redeliveries
// and dead letters per queue and for the whole broker (the overview),
// besides publish, deliver and ack. Time is an input: samples are taken
// at fake instants 2 s apart.
func TestRedeliverAndDeadLetterRates(t *testing.T) {
	pw, _ := netio.HashPassword("x")
	srv := warrentest.StartServer(t, &netio.Config{Users: []netio.User{{Name: "x", PasswordHash: pw}}})
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, time.Hour)
	t.Cleanup(a.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e := &env{t: t, srv: srv, api: httptestServer(t, a)}
	for _, r := range []struct{ path, body string }{
		{"/api/exchanges/dlx", `{"type":"fanout"}`},
		{"/api/queues/dlq", `{}`},
		{"/api/queues/work", `{"dead_letter_exchange":"dlx"}`},
	} {
		if st := e.do("PUT", r.path, r.body, nil); st != 200 {
			t.Fatalf("%s: %d", r.path, st)
		}
	}
	e.do("PUT", "/api/bindings", `{"exchange":"dlx","queue":"dlq","routing_key":""}`, nil)
	t0 := time.Unix(1000, 0)
	a.SampleAt(t0)
	c, err := client.Dial(ctx, warrentest.URL(srv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, _ := c.Channel(ctx)
	publish(t, ch, "work", 4)
	cs, err := ch.Consume(ctx, "work", client.ConsumeOptions{Prefetch: 4})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		(<-cs.Deliveries()).Nack(true) // back to the queue: each comes again, redelivered
	}
	for range 4 {
		(<-cs.Deliveries()).Reject() // dead-lettered to dlq
	}
	expectReady(t, srv, ch, "dlq", 4)
	a.SampleAt(t0.Add(2 * time.Second))
	hs := e.api
	var q api.Queue
	getJSON(t, hs, "/api/queues/work", &q)
	if q.Rates.Publish != 2 || q.Rates.Redeliver != 2 || q.Rates.DeadLetter != 2 {
		t.Fatalf("work rates %+v", q.Rates)
	}
	var o api.Overview
	getJSON(t, hs, "/api/overview", &o)
	if o.Rates.Redeliver != 2 || o.Rates.DeadLetter != 2 || o.Rates.Publish != 4 || o.Redelivered != 4 || o.DeadLettered != 4 {
		t.Fatalf("overview rates %+v redelivered %d dead-lettered %d", o.Rates, o.Redelivered, o.DeadLettered)
	}
}

// TestRatesFirstSeenQueue: a queue the sampler sees for the first time
// brings its totals as a baseline (a replica opened or caught up on this
// node has its log's counts), not as the interval's publishes: its rates
// read 0, and the next sample counts what came since.
func TestRatesFirstSeenQueue(t *testing.T) {
	srv := warrentest.StartServer(t, nil)
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, time.Hour)
	t.Cleanup(a.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e := &env{t: t, srv: srv, api: httptestServer(t, a)}
	t0 := time.Unix(1000, 0)
	a.SampleAt(t0) // no queue yet
	if st := e.do("PUT", "/api/queues/late", `{}`, nil); st != 200 {
		t.Fatalf("declare: %d", st)
	}
	c, err := client.Dial(ctx, warrentest.URL(srv))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ch, _ := c.Channel(ctx)
	publish(t, ch, "late", 40)
	expectReady(t, srv, ch, "late", 40)
	a.SampleAt(t0.Add(2 * time.Second))
	var q api.Queue
	getJSON(t, e.api, "/api/queues/late", &q)
	var o api.Overview
	getJSON(t, e.api, "/api/overview", &o)
	if q.Rates.Publish != 0 || o.Rates.Publish != 0 {
		t.Fatalf("first seen with 40 published: queue rates %+v, overview %+v (want 0: a baseline)", q.Rates, o.Rates)
	}
	publish(t, ch, "late", 4)
	expectReady(t, srv, ch, "late", 44)
	a.SampleAt(t0.Add(4 * time.Second))
	getJSON(t, e.api, "/api/queues/late", &q)
	getJSON(t, e.api, "/api/overview", &o)
	if q.Rates.Publish != 2 || o.Rates.Publish != 2 {
		t.Fatalf("4 more in 2 s: queue rates %+v, overview %+v (want publish 2)", q.Rates, o.Rates)
	}
}

// expectUnacked is expectReady for a queue whose messages are all out.
func expectUnacked(t *testing.T, srv *netio.Server, ch *client.Channel, q string, n int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := ch.DeclareExchange(ctx, "amq.direct", "direct", client.ExchangeOptions{Passive: true}); err != nil {
		t.Fatalf("round trip: %v", err)
	}
	if err := srv.Barrier(ctx); err != nil {
		t.Fatal(err)
	}
	if info, _ := srv.Queue(q); info.Unacked != n {
		t.Fatalf("queue %s: unacked %d, want %d", q, info.Unacked, n)
	}
}

func httptestServer(t *testing.T, a *admin.API) *httptest.Server {
	hs := httptest.NewServer(a)
	t.Cleanup(hs.Close)
	return hs
}

func getJSON(t *testing.T, hs *httptest.Server, path string, out any) {
	t.Helper()
	req, _ := http.NewRequest("GET", hs.URL+path, nil)
	req.SetBasicAuth("guest", "guest")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d", path, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		t.Fatal(err)
	}
}

// TestReplaySelectedEndpoint: POST /api/queues/{name}/replay with ids
// (as POST .../get shows them) moves those messages and no others; ids
// with a count, or more ids than a peek can show, are refused with a 400.
func TestReplaySelectedEndpoint(t *testing.T) {
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
	publish(t, ch, "orders", 4) // a, b, c, d
	cs, _ := ch.Consume(ctx, "orders", client.ConsumeOptions{Prefetch: 10})
	for range 4 {
		(<-cs.Deliveries()).Reject()
	}
	if err := cs.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	expectReady(t, e.srv, ch, "orders.dlq", 4)

	var got api.Messages
	if st := e.do("POST", "/api/queues/orders.dlq/get", `{"count":10}`, &got); st != 200 || len(got.Messages) != 4 {
		t.Fatalf("get: %d %+v", st, got)
	}
	var res api.ReplayResult
	body := fmt.Sprintf(`{"ids":[%d,%d],"rate":1000}`, got.Messages[2].ID, got.Messages[1].ID)
	if st := e.do("POST", "/api/queues/orders.dlq/replay", body, &res); st != 200 || res.Moved != 2 || res.Missing != 0 {
		t.Fatalf("replay of c and b: %d %+v", st, res)
	}
	expectReady(t, e.srv, ch, "orders", 2)
	expectReady(t, e.srv, ch, "orders.dlq", 2)
	bodies := func(q string) string {
		var ms api.Messages
		e.do("POST", "/api/queues/"+q+"/get", `{"count":10}`, &ms)
		s := ""
		for _, m := range ms.Messages {
			s += string(m.Body)
		}
		return s
	}
	if o, d := bodies("orders"), bodies("orders.dlq"); o != "bc" || d != "ad" {
		t.Fatalf("after replaying c and b: orders %q, orders.dlq %q; want \"bc\" and \"ad\"", o, d)
	}
	refused := func(body string) (int, string) {
		var eb admin.ErrorBody
		st := e.do("POST", "/api/queues/orders.dlq/replay", body, &eb)
		return st, eb.Error.Message
	}
	if st, msg := refused(fmt.Sprintf(`{"ids":[%d],"count":1}`, got.Messages[0].ID)); st != 400 || !strings.Contains(msg, "ids") {
		t.Fatalf("ids with a count: %d %q, want a 400 about ids", st, msg)
	}
	ids := strings.Repeat("1,", admin.MaxReplayIDs) + "1"
	if st, msg := refused(`{"ids":[` + ids + `]}`); st != 400 || !strings.Contains(msg, "ids") {
		t.Fatalf("%d ids: %d %q, want a 400 about ids", admin.MaxReplayIDs+1, st, msg)
	}
}

// TestOverviewDiskAlarm: GET /api/overview says whether the disk alarm is
// on and what the free-disk limit is, as /metrics does (warren_disk_alarm,
// warren_disk_free_limit_bytes).
func TestOverviewDiskAlarm(t *testing.T) {
	const limit = 1 << 30
	var free atomic.Int64
	free.Store(10 << 30)
	srv := warrentest.StartServer(t, &netio.Config{TickInterval: 5 * time.Millisecond, DiskFreeLimit: limit, DiskCheckInterval: time.Millisecond,
		DiskFree: func() (int64, bool) { return free.Load(), true }})
	a := admin.New(srv.Broker, warrentest.AdminConnections(srv), nil, 50*time.Millisecond)
	t.Cleanup(a.Close)
	hs := httptestServer(t, a)
	var o api.Overview
	getJSON(t, hs, "/api/overview", &o)
	if o.DiskAlarm || o.DiskFreeLimit != limit {
		t.Fatalf("overview with free disk: disk_alarm %v, disk_free_limit_bytes %d; want false and %d", o.DiskAlarm, o.DiskFreeLimit, limit)
	}
	free.Store(100 << 20)
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for !srv.Overview().DiskAlarm { // raised on the server's tick: poll, with a deadline
		select {
		case <-tick.C:
		case <-deadline:
			t.Fatal("the disk alarm was not raised")
		}
	}
	getJSON(t, hs, "/api/overview", &o)
	if !o.DiskAlarm || !o.FlowBlocked {
		t.Fatalf("overview under the disk alarm: disk_alarm %v, flow_blocked %v; want both", o.DiskAlarm, o.FlowBlocked)
	}
}
