package admin

import (
	"cmp"
	"context"
	"encoding/base64"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/warren-mq/warren/admin/api"
	"github.com/warren-mq/warren/broker"
	"github.com/warren-mq/warren/wire"
)

// MaxPageSize is the largest page GET /api/queues serves.
const MaxPageSize = 500

// queueSorts are the columns GET /api/queues sorts by, and how (0 for
// name: ties are broken by name anyway).
var queueSorts = map[string]func(a, b *queueRow) int{
	"name":                      func(a, b *queueRow) int { return 0 },
	"ready":                     func(a, b *queueRow) int { return cmp.Compare(a.s.Ready, b.s.Ready) },
	"unacked":                   func(a, b *queueRow) int { return cmp.Compare(a.s.Unacked, b.s.Unacked) },
	"consumers":                 func(a, b *queueRow) int { return cmp.Compare(a.s.Consumers, b.s.Consumers) },
	"published_total":           func(a, b *queueRow) int { return cmp.Compare(a.s.Published, b.s.Published) },
	"delivered_total":           func(a, b *queueRow) int { return cmp.Compare(a.s.Delivered, b.s.Delivered) },
	"acked_total":               func(a, b *queueRow) int { return cmp.Compare(a.s.Acked, b.s.Acked) },
	"redelivered_total":         func(a, b *queueRow) int { return cmp.Compare(a.s.Redelivered, b.s.Redelivered) },
	"dead_lettered_total":       func(a, b *queueRow) int { return cmp.Compare(a.s.DeadLettered, b.s.DeadLettered) },
	"dead_letter_dropped_total": func(a, b *queueRow) int { return cmp.Compare(a.s.DeadLetterDropped, b.s.DeadLetterDropped) },
	"rates.publish":             func(a, b *queueRow) int { return cmp.Compare(a.r.Publish, b.r.Publish) },
	"rates.deliver":             func(a, b *queueRow) int { return cmp.Compare(a.r.Deliver, b.r.Deliver) },
	"rates.ack":                 func(a, b *queueRow) int { return cmp.Compare(a.r.Ack, b.r.Ack) },
	"rates.redeliver":           func(a, b *queueRow) int { return cmp.Compare(a.r.Redeliver, b.r.Redeliver) },
	"rates.dead_letter":         func(a, b *queueRow) int { return cmp.Compare(a.r.DeadLetter, b.r.DeadLetter) },
}

// queueRow is one queue being sorted: its counts, and its rates when the
// sort is by a rate.
type queueRow struct {
	s *broker.QueueStats
	r Rates
}

var sortNames = func() string {
	var ns []string
	for n := range queueSorts {
		ns = append(ns, n)
	}
	slices.Sort(ns)
	return strings.Join(ns, ", ")
}()

// listQueues is GET /api/queues: every queue (a JSON array), or with page
// or page_size one page of them (api.QueuePage); sort, order and name (a
// case-insensitive substring of the queue's name) apply to both. Only the
// queues on the page are looked up in full, so a page costs the counters
// of every queue (read without locks) plus its own rows.
func (a *API) listQueues(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	for k, v := range q {
		switch k {
		case "page", "page_size", "sort", "order", "name", "vhost":
			if len(v) > 1 {
				writeErr(w, badParam(k, "give it once"))
				return
			}
		default:
			writeErr(w, badParam(k, "unknown parameter; GET /api/queues takes page, page_size, sort, order, name and vhost"))
			return
		}
	}
	paged := q.Has("page") || q.Has("page_size")
	page, size := 1, 100
	if v := q.Get("page"); q.Has("page") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			writeErr(w, badParam("page", "want a page number from 1"))
			return
		}
		page = n
	}
	if v := q.Get("page_size"); q.Has("page_size") {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > MaxPageSize {
			writeErr(w, badParam("page_size", "want an integer in [1, "+strconv.Itoa(MaxPageSize)+"]"))
			return
		}
		size = n
	}
	by := queueSorts["name"]
	if s := q.Get("sort"); q.Has("sort") {
		f, ok := queueSorts[s]
		if !ok {
			writeErr(w, badParam("sort", "want one of "+sortNames))
			return
		}
		by = f
	}
	desc := false
	switch o := q.Get("order"); o {
	case "", "asc":
	case "desc":
		desc = true
	default:
		writeErr(w, badParam("order", "want asc or desc"))
		return
	}
	stats := inVhost(a.b.AppendQueueStats(nil), reqVhost(r))
	total := len(stats)
	filter := strings.ToLower(q.Get("name"))
	byRate := strings.HasPrefix(q.Get("sort"), "rates.")
	rows := make([]queueRow, 0, len(stats))
	if byRate {
		a.mu.Lock()
	}
	for i := range stats {
		s := &stats[i]
		if filter != "" && !containsFold(s.Name, filter) {
			continue
		}
		row := queueRow{s: s}
		if byRate {
			row.r = a.rates[s.Name]
		}
		rows = append(rows, row)
	}
	if byRate {
		a.mu.Unlock()
	}
	// Sort pointers: the comparisons take no copies.
	order := make([]*queueRow, len(rows))
	for i := range rows {
		order[i] = &rows[i]
	}
	slices.SortFunc(order, func(x, y *queueRow) int {
		c := by(x, y)
		if c == 0 {
			c = strings.Compare(x.s.Name, y.s.Name) // ties in name order, whatever the order
		}
		if desc {
			return -c
		}
		return c
	})
	lo, hi := 0, len(order)
	if paged {
		lo, hi = min((page-1)*size, len(order)), min(page*size, len(order))
	}
	items := make([]api.Queue, 0, hi-lo)
	for _, row := range order[lo:hi] {
		if info, ok := a.b.Queue(row.s.Name); ok {
			items = append(items, a.queue(info))
		}
	}
	if !paged {
		writeJSON(w, 200, items)
		return
	}
	writeJSON(w, 200, api.QueuePage{Items: items, Page: page, PageSize: size, PageCount: max(1, (len(rows)+size-1)/size),
		FilteredCount: len(rows), TotalCount: total})
}

// containsFold reports whether s contains sub, a lower-case string,
// ignoring case; plain ASCII names need no allocation.
func containsFold(s, sub string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return strings.Contains(strings.ToLower(s), sub)
		}
	}
	for i := 0; i+len(sub) <= len(s); i++ {
		j := 0
		for ; j < len(sub); j++ {
			c := s[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != sub[j] {
				break
			}
		}
		if j == len(sub) {
			return true
		}
	}
	return false
}

func badParam(name, what string) error {
	return &wire.Error{Code: wire.InvalidArgument, Reason: "query parameter " + name + ": " + what}
}

// publish is POST /api/exchanges/{name}/publish: one message routed
// through the broker in process (amq.default names the default exchange),
// answered once every queue it was routed to has taken it.
func (a *API) publish(w http.ResponseWriter, r *http.Request) {
	var body api.PublishRequest
	if err := decode(r, &body); err != nil {
		writeErr(w, err)
		return
	}
	payload := []byte(body.Payload)
	switch body.PayloadEncoding {
	case "", "string":
	case "base64":
		b, err := base64.StdEncoding.DecodeString(body.Payload)
		if err != nil {
			writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "payload is not base64: " + err.Error()})
			return
		}
		payload = b
	default:
		writeErr(w, &wire.Error{Code: wire.InvalidArgument, Reason: "payload_encoding must be string or base64"})
		return
	}
	if a.conns.ConnectionStats().FlowBlocked {
		writeErr(w, &wire.Error{Code: wire.ResourceLimit, Reason: "the memory alarm is on: publishing waits until stored messages drop below the watermark"})
		return
	}
	exchange := r.PathValue("name")
	if exchange == "amq.default" {
		exchange = ""
	}
	exchange = broker.QualifyName(reqVhost(r), exchange) // "" in a vhost: its default exchange
	if err := wire.CheckProps(body.Properties); err != nil {
		writeErr(w, err) // what AppendProps cannot encode: it panicked
		return
	}
	props := wire.AppendProps(nil, body.Properties)[2:]
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	n, err := a.b.PublishOne(ctx, exchange, body.RoutingKey, props, payload, body.Priority)
	if err != nil {
		writeErr(w, err)
		return
	}
	writeJSON(w, 200, api.PublishResult{Routed: n > 0, Queues: n})
}
