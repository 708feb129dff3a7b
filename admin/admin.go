// Package admin is Warren's HTTP admin API: topology, inspection, purge and
// dead-letter replay, as JSON over HTTP, authenticated with the broker's
// users (the administrator tag for writes). spec/admin-api.yaml describes
// it; warrend serves it on its HTTP port and warrenctl is its client.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// API serves the admin endpoints for one broker.
type API struct {
	b     *broker.Broker
	conns Connections
	log   *slog.Logger
	mux   *http.ServeMux
	stop  chan struct{}
	// dataDir: the overview reports its file system's space ("": none).
	dataDir string

	mu    sync.Mutex
	prev  map[string]broker.QueueStats
	prevT time.Time
	rates map[string]Rates
	total Rates // the whole broker's, over the last interval

	clusterNodes func() []ClusterNode // cluster.go (SetClusterNodes)

	// lists holds a slot per whole list being built, listBytes the
	// answers built and not yet written (lists.go), listWait how long a
	// request waits for either.
	lists     chan struct{}
	listBytes listBudget
	listWait  time.Duration

	// PasswordCost is the bcrypt cost of the hashes PUT /api/users makes
	// from a password (0: bcrypt.DefaultCost). Tests lower it: a cost-10
	// check under the race detector on a loaded machine takes seconds.
	PasswordCost int
}

// Rates are per-second rates over the last sampling interval.
type Rates = api.Rates

// ErrorBody is every error reply: the protocol's error code and name, and
// a message.
type ErrorBody = api.ErrorBody

// New returns the API for broker b, whose connection layer is conns;
// sampleEvery sets how often per-queue rates are recomputed (5s if 0).
// Close stops the sampler.
func New(b *broker.Broker, conns Connections, log *slog.Logger, sampleEvery time.Duration) *API {
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if sampleEvery <= 0 {
		sampleEvery = 5 * time.Second
	}
	a := &API{b: b, conns: conns, log: log, mux: http.NewServeMux(), stop: make(chan struct{}), rates: map[string]Rates{},
		lists: make(chan struct{}, maxWholeLists), listWait: wholeListWait}
	a.routes()
	a.sample()
	go func() {
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-a.stop:
				return
			case <-t.C:
				a.sample()
			}
		}
	}()
	return a
}

// Close stops the rate sampler.
func (a *API) Close() { close(a.stop) }

func (a *API) sample() { a.sampleAt(time.Now()) }

// sampleAt computes every queue's rates, and the broker's, since the last
// sample; now is the time of this one (an input, so tests can fake it).
// The broker's rates sum the queues' changes, each queue counted only
// against its own previous sample, so a deleted queue does not make a
// rate dip below zero, and a queue first seen, or whose counts came from
// elsewhere at the last sample (sameSource), has no rates until its next
// sample.
func (a *API) sampleAt(now time.Time) {
	cur := map[string]broker.QueueStats{}
	for _, q := range a.b.Queues() {
		cur[q.Name] = q
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.prev != nil {
		dt := now.Sub(a.prevT).Seconds()
		rates := make(map[string]Rates, len(cur))
		var d broker.QueueStats // the changes since the last sample
		for n, q := range cur {
			p, seen := a.prev[n]
			if !seen || !sameSource(p, q) {
				// First seen, or its counts come from elsewhere now: its
				// totals are this sample's baseline, not this interval's
				// work (a replica opened, moved in or caught up here
				// brings the counts of its log; a queue declared in the
				// interval shows rates from the next one).
				continue
			}
			rates[n] = Rates{Publish: rate(q.Published, p.Published, dt), Deliver: rate(q.Delivered, p.Delivered, dt), Ack: rate(q.Acked, p.Acked, dt),
				Redeliver: rate(q.Redelivered, p.Redelivered, dt), DeadLetter: rate(q.DeadLettered, p.DeadLettered, dt)}
			d.Published += delta(q.Published, p.Published)
			d.Delivered += delta(q.Delivered, p.Delivered)
			d.Acked += delta(q.Acked, p.Acked)
			d.Redelivered += delta(q.Redelivered, p.Redelivered)
			d.DeadLettered += delta(q.DeadLettered, p.DeadLettered)
		}
		a.rates = rates
		a.total = Rates{Publish: rate(d.Published, 0, dt), Deliver: rate(d.Delivered, 0, dt), Ack: rate(d.Acked, 0, dt),
			Redeliver: rate(d.Redelivered, 0, dt), DeadLetter: rate(d.DeadLettered, 0, dt)}
	}
	a.prev, a.prevT = cur, now
}

// sameSource reports whether two samples of a queue's counts come from
// the same place, so that their difference is work done between them:
// the answering node's own copy both times (a non-durable queue's, or
// its replica's, whatever raft role it had). A node without a replica
// ("none": the counts last fetched from the leader) or whose replica
// failed has no rates, and a replica that opened or moved in since
// brings its log's whole history.
func sameSource(p, q broker.QueueStats) bool {
	here := func(role string) bool { return role == "" || role == "leader" || role == "follower" }
	return here(p.RaftRole) && here(q.RaftRole) && (p.RaftRole == "") == (q.RaftRole == "")
}

func delta(cur, prev uint64) uint64 {
	if cur < prev {
		return 0
	}
	return cur - prev
}

func rate(cur, prev uint64, dt float64) float64 {
	if dt <= 0 || cur < prev {
		return 0
	}
	return math.Round(float64(cur-prev)/dt*10) / 10
}

// overview sums the broker's state: the queues' from the broker, the
// connections' from the connection layer.
func (a *API) overview() api.Overview {
	// Totals sums without a copy of every queue's counts: the overview
	// is polled by every open console page.
	t, c := a.b.Totals(), a.conns.ConnectionStats()
	redelivered, deadLettered := t.Redelivered, t.DeadLettered
	a.mu.Lock()
	rates := a.total
	a.mu.Unlock()
	o := api.Overview{Redelivered: redelivered, DeadLettered: deadLettered, Rates: rates, Version: c.Version, Connections: c.Connections, Channels: c.Channels,
		Exchanges: t.Exchanges, Queues: t.Queues, Ready: t.Ready, Unacked: t.Unacked, Consumers: t.Consumers,
		StoredMessageBytes: a.b.StoredBytes(), MemoryHighWatermark: c.MemoryHighWatermark, FlowBlocked: c.FlowBlocked,
		DiskAlarm: c.DiskAlarm, DiskFreeLimit: c.DiskFreeLimit,
		Published: t.Published, Delivered: t.Delivered, Acked: t.Acked}
	if a.dataDir != "" {
		o.DiskFree, o.DiskTotal = diskSpace(a.dataDir)
	}
	return o
}

// ServeHTTP authenticates and dispatches.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	user, pass, ok := r.BasicAuth()
	if !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="warren"`)
		writeErr(w, &wire.Error{Code: wire.AccessRefused, Reason: "authentication required"})
		return
	}
	_, ok = a.conns.Authenticate(user, pass, r.RemoteAddr)
	if !ok {
		w.Header().Set("WWW-Authenticate", `Basic realm="warren"`)
		writeErr(w, &wire.Error{Code: wire.AuthFailed, Reason: a.conns.AuthRefusal(user, r.RemoteAddr)})
		return
	}
	a.ServeAuthenticated(w, r, user)
}

// ServeAuthenticated serves r for user, whose credentials the caller has
// already verified (the web console's session does): the same endpoints
// and the same authorization as ServeHTTP.
func (a *API) ServeAuthenticated(w http.ResponseWriter, r *http.Request, user string) {
	// The one authorization check the native protocol uses too: the admin
	// API is an operator interface, so its writes need the administrator tag.
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := a.conns.AuthorizeOperator(user); err != nil {
			writeErr(w, err)
			return
		}
	}
	a.mux.ServeHTTP(w, withVhostSegments(r).WithContext(context.WithValue(r.Context(), userKey{}, user)))
}

func (a *API) routes() {
	m := a.mux
	a.userRoutes()
	a.permissionRoutes()
	a.vhostRoutes()
	a.clusterRoutes()
	m.HandleFunc("GET /api/overview", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, 200, a.overview()) })

	m.HandleFunc("GET /api/exchanges", a.wholeList(a.listExchanges))
	a.handle("GET /api/exchanges/{name}", a.getExchange)
	a.handle("PUT /api/exchanges/{name}", a.putExchange)
	a.handle("DELETE /api/exchanges/{name}", func(w http.ResponseWriter, r *http.Request) {
		if err := a.b.DeleteExchange(qname(r), r.URL.Query().Get("if_unused") == "true"); err != nil {
			writeErr(w, localErr(err))
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})

	m.HandleFunc("GET /api/queues", a.wholeList(a.listQueues))
	m.HandleFunc("GET /api/channels", a.wholeList(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, nonNil(a.conns.ListChannels()))
	}))
	a.handle("POST /api/exchanges/{name}/publish", a.publish)
	a.handle("GET /api/queues/{name}", func(w http.ResponseWriter, r *http.Request) {
		info, ok := a.b.Queue(qname(r))
		if !ok {
			writeErr(w, &wire.Error{Code: wire.NotFound, Reason: "no queue " + strconv.Quote(r.PathValue("name"))})
			return
		}
		writeJSON(w, 200, a.queue(info))
	})
	a.handle("PUT /api/queues/{name}", a.putQueue)
	a.handle("DELETE /api/queues/{name}", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		n, err := a.b.DeleteQueue(r.Context(), qname(r), q.Get("if_unused") == "true", q.Get("if_empty") == "true")
		if err != nil {
			writeErr(w, localErr(err))
			return
		}
		writeJSON(w, 200, api.Deleted{Messages: n})
	})
	a.handle("POST /api/queues/{name}/purge", func(w http.ResponseWriter, r *http.Request) {
		n, err := a.b.PurgeQueue(r.Context(), qname(r))
		if err != nil {
			writeErr(w, localErr(err))
			return
		}
		writeJSON(w, 200, api.Purged{Messages: n})
	})
	a.handle("POST /api/queues/{name}/get", a.getMessages)
	a.handle("POST /api/queues/{name}/replay", a.replay)

	m.HandleFunc("GET /api/bindings", a.wholeList(a.listBindings))
	m.HandleFunc("PUT /api/bindings", func(w http.ResponseWriter, r *http.Request) { a.binding(w, r, false) })
	m.HandleFunc("DELETE /api/bindings", func(w http.ResponseWriter, r *http.Request) { a.binding(w, r, true) })

	m.HandleFunc("GET /api/connections", a.wholeList(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, nonNil(a.conns.ListConnections()))
	}))
	m.HandleFunc("DELETE /api/connections/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseUint(r.PathValue("id"), 10, 64)
		if err != nil {
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "connection id must be a number"})
			return
		}
		if !a.conns.CloseConnection(id, "closed by an operator") {
			writeErr(w, &wire.Error{Code: wire.NotFound, Reason: "no connection " + r.PathValue("id")})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if allow := a.allowed(r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeErr(w, &statusErr{http.StatusMethodNotAllowed, &wire.Error{Code: wire.NotAllowed,
				Reason: r.Method + " is not allowed on " + r.URL.Path + "; allowed: " + strings.Join(allow, ", ")}})
			return
		}
		writeErr(w, &wire.Error{Code: wire.NotFound, Reason: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
}

// allowed lists the methods that r's path takes (none: no such path).
func (a *API) allowed(r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPut, http.MethodPost, http.MethodDelete} {
		r2 := r.Clone(r.Context())
		r2.Method = m
		if _, pattern := a.mux.Handler(r2); pattern != "/" {
			allow = append(allow, m)
		}
	}
	return allow
}

// statusErr is a protocol error answered with an HTTP status of its own
// (413, 405) instead of the one its code maps to.
type statusErr struct {
	status int
	err    *wire.Error
}

func (e *statusErr) Error() string { return e.err.Error() }
func (e *statusErr) Unwrap() error { return e.err }

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ---- JSON helpers ----

func status(code wire.Code) int {
	switch code {
	case wire.NotFound, wire.ExchangeNotFound:
		return http.StatusNotFound
	case wire.ExchangeInternal:
		return http.StatusForbidden
	case wire.ResourceLimit, wire.LimitReached:
		return http.StatusServiceUnavailable
	case wire.PreconditionFailed, wire.ResourceLocked:
		return http.StatusConflict
	case wire.AccessRefused, wire.NotAllowed:
		return http.StatusForbidden
	case wire.AuthFailed:
		return http.StatusUnauthorized
	case wire.InvalidArgument, wire.FrameError:
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}

func writeErr(w http.ResponseWriter, err error) {
	var we *wire.Error
	if !errors.As(err, &we) {
		we = &wire.Error{Code: wire.InternalError, Reason: err.Error()}
	}
	var b ErrorBody
	b.Error.Code, b.Error.Name, b.Error.Message = int(we.Code), we.Code.String(), we.Reason
	if se := (*statusErr)(nil); errors.As(err, &se) {
		writeJSON(w, se.status, b)
		return
	}
	if we.Code == wire.AccessRefused && we.Reason == "authentication required" {
		writeJSON(w, http.StatusUnauthorized, b)
		return
	}
	writeJSON(w, status(we.Code), b)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// maxBody is the largest request body the API reads (1 MiB): a declare or
// a settings document is far smaller.
const maxBody = 1 << 20

// decode reads a JSON body strictly: unknown fields and trailing data are
// refused, and a body over maxBody is 413.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if mb := (*http.MaxBytesError)(nil); errors.As(err, &mb) {
			return &statusErr{http.StatusRequestEntityTooLarge, &wire.Error{Code: wire.InvalidArgument,
				Reason: "request body larger than the limit of 1 MiB (1048576 bytes)"}}
		}
		if errors.Is(err, io.EOF) {
			return &wire.Error{Code: wire.InvalidArgument, Reason: "request body required"}
		}
		if te := (*json.UnmarshalTypeError)(nil); errors.As(err, &te) {
			return typeErr(te)
		}
		return &wire.Error{Code: wire.InvalidArgument, Reason: "bad request body: " + err.Error()}
	}
	if dec.More() {
		return &wire.Error{Code: wire.InvalidArgument, Reason: "bad request body: trailing data"}
	}
	return nil
}

// typeErr says which field of a request body has the wrong JSON type and
// what it takes, without Go's names for either: a queue setting by its
// descriptor ("queue setting max_priority: want an int in [1, 255]").
func typeErr(te *json.UnmarshalTypeError) error {
	field := te.Field[strings.LastIndexByte(te.Field, '.')+1:]
	if d, ok := api.DescOfJSON(field); ok {
		return api.SettingError(d)
	}
	want := "a value of another type"
	switch te.Type.Kind() {
	case reflect.Bool:
		want = "true or false"
	case reflect.String:
		want = "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "an integer"
	case reflect.Float32, reflect.Float64:
		want = "a number"
	case reflect.Map, reflect.Struct:
		want = "an object"
	}
	return &wire.Error{Code: wire.InvalidArgument, Reason: "bad request body: " + field + ": want " + want + ", not " + te.Value}
}

// jsonToTable converts JSON arguments to a protocol table: strings,
// booleans, integers (numbers without a fraction) and floats.
func jsonToTable(m map[string]any) (wire.Table, error) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var t wire.Table
	for _, k := range keys {
		var v wire.Value
		switch x := m[k].(type) {
		case string:
			v = wire.String(x)
		case bool:
			v = wire.Bool(x)
		case json.Number:
			if i, err := x.Int64(); err == nil {
				v = wire.Int(i)
			} else if f, err := x.Float64(); err == nil {
				v = wire.Float(f)
			} else {
				return nil, &wire.Error{Code: wire.InvalidArgument, Reason: "argument " + k + ": bad number"}
			}
		case float64:
			if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
				v = wire.Int(int64(x))
			} else {
				v = wire.Float(x)
			}
		case nil:
			v = wire.Null()
		default:
			return nil, &wire.Error{Code: wire.InvalidArgument, Reason: "argument " + k + ": want a string, number or boolean"}
		}
		t = append(t, wire.Field{Key: k, Value: v})
	}
	return t, nil
}

func tableToJSON(t wire.Table) map[string]any {
	if len(t) == 0 {
		return nil
	}
	m := map[string]any{}
	for _, f := range t {
		switch f.Value.Kind {
		case wire.KindString, wire.KindBytes:
			m[f.Key] = string(f.Value.Bytes)
		case wire.KindBool:
			m[f.Key] = f.Value.Int != 0
		case wire.KindInt, wire.KindTimestamp:
			m[f.Key] = f.Value.Int
		case wire.KindFloat:
			m[f.Key] = f.Value.Float
		default:
			m[f.Key] = nil
		}
	}
	return m
}

// ---- exchanges ----

func (a *API) getExchange(w http.ResponseWriter, r *http.Request) {
	name, qn := r.PathValue("name"), qname(r)
	for _, e := range a.b.Exchanges() {
		if e.Name == qn {
			writeJSON(w, 200, localExchange(e))
			return
		}
	}
	writeErr(w, &wire.Error{Code: wire.NotFound, Reason: "no exchange " + strconv.Quote(name)})
}

func (a *API) putExchange(w http.ResponseWriter, r *http.Request) {
	var body api.ExchangeSettings
	if err := decode(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	kind, ok := wire.ParseExchangeKind(body.Type)
	if !ok {
		writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "type must be direct, topic, fanout, headers or consistent-hash"})
		return
	}
	args, err := jsonToTable(body.Arguments)
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := a.b.DeclareExchange(wire.ExchangeDeclare{Name: qname(r), Kind: kind, Durable: body.Durable, AutoDelete: body.AutoDelete,
		Internal: body.Internal, Alternate: qualify(r, body.Alternate), Args: args}); err != nil {
		writeErr(w, localErr(err))
		return
	}
	a.getExchange(w, r)
}

// ---- bindings ----

func (a *API) binding(w http.ResponseWriter, r *http.Request, unbind bool) {
	var b api.Binding
	if err := decode(r, &b); err != nil {
		writeErr(w, err)
		return
	}
	if (b.Queue == "") == (b.DestinationExchange == "") {
		writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "give exactly one of queue and destination_exchange"})
		return
	}
	args, err := jsonToTable(b.Arguments)
	if err != nil {
		writeErr(w, err)
		return
	}
	vh := reqVhost(r)
	wb := wire.Bind{Unbind: unbind, Source: broker.QualifyName(vh, b.Exchange), Destination: broker.QualifyName(vh, b.Queue), RoutingKey: b.RoutingKey, Args: args}
	if b.DestinationExchange != "" {
		wb.Destination, wb.ToExchange = broker.QualifyName(vh, b.DestinationExchange), true
	}
	if err := a.b.Bind(wb); err != nil {
		writeErr(w, localErr(err))
		return
	}
	if unbind {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, 200, b)
}

// ---- queues ----

// queue is one queue's JSON: its settings are its declared arguments, read
// back by their descriptors.
func (a *API) queue(info broker.QueueInfo) api.Queue {
	a.mu.Lock()
	r := a.rates[info.Name]
	a.mu.Unlock()
	info.Name = broker.LocalName(info.Name)
	return api.Queue{QueueStats: api.QueueStats(info.QueueStats), Exclusive: info.Exclusive,
		QueueSettings: api.QueueSettings{Durable: info.Durable, AutoDelete: info.AutoDelete, QueueArgs: api.QueueArgsOf(info.Declared)}, Rates: r}
}

func (a *API) putQueue(w http.ResponseWriter, r *http.Request) {
	var qs api.QueueSettings
	if err := decode(r, &qs); err != nil {
		writeErr(w, err)
		return
	}
	if err := qs.Check(); err != nil {
		writeErr(w, err)
		return
	}
	name := qname(r)
	if _, err := a.b.DeclareQueue(wire.QueueDeclare{Name: name, Durable: qs.Durable, AutoDelete: qs.AutoDelete, Args: qs.Table()}); err != nil {
		writeErr(w, localErr(err))
		return
	}
	info, _ := a.b.Queue(name)
	writeJSON(w, 200, a.queue(info))
}

// ---- inspection and replay ----

func (a *API) getMessages(w http.ResponseWriter, r *http.Request) {
	body := api.CountRequest{Count: 10}
	if r.ContentLength != 0 {
		if err := decode(r, &body); err != nil {
			writeErr(w, err)
			return
		}
	}
	if body.Count < 1 || body.Count > 10000 || body.Rate != 0 || body.IDs != nil {
		writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "count must be in [1, 10000]"})
		return
	}
	msgs, err := a.b.PeekQueue(r.Context(), qname(r), body.Count)
	if err != nil {
		writeErr(w, localErr(err))
		return
	}
	out := api.Messages{Messages: make([]api.Message, len(msgs))}
	for i, m := range msgs {
		out.Messages[i] = api.Message(m)
	}
	writeJSON(w, 200, out)
}

func (a *API) replay(w http.ResponseWriter, r *http.Request) {
	var body api.CountRequest
	if r.ContentLength != 0 {
		if err := decode(r, &body); err != nil {
			writeErr(w, err)
			return
		}
	}
	if body.Count < 0 || body.Rate < 0 {
		writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "count and rate must not be negative"})
		return
	}
	if body.IDs != nil {
		switch {
		case body.Count != 0:
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "give ids (the messages to replay) or count (how many from the head), not both"})
			return
		case len(body.IDs) == 0 || len(body.IDs) > MaxReplayIDs:
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: fmt.Sprintf("ids: want 1 to %d message ids (as /get shows them), got %d", MaxReplayIDs, len(body.IDs))})
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Minute)
	defer cancel()
	var res ReplayResult
	var err error
	if body.IDs != nil {
		res, err = ReplaySelected(ctx, a.b, qname(r), body.IDs, body.Rate)
	} else {
		res, err = Replay(ctx, a.b, qname(r), body.Count, body.Rate)
	}
	if err != nil && res.Moved == 0 {
		writeErr(w, localErr(err))
		return
	}
	if err != nil {
		res.Error = err.Error()
	}
	writeJSON(w, 200, res)
}
