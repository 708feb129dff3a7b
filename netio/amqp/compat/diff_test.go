package compat

// The differential test (make amqp-diff): seeded short scenarios of AMQP
// 0-9-1 operations, each run by amqp091-go against a RabbitMQ (the URL in
// WARREN_AMQP_DIFF_RABBIT, e.g. amqp://guest:guest@127.0.0.1:5672/) and
// against an in-process Warren, each through a small proxy that records
// every channel.close and connection.close the broker sends (reply code,
// text, class and method ids: amqp091-go drops the ids). Each run writes a
// trace of what the client observed (routing, returns, confirms, message
// order, bodies, delivery tags, redelivered flags, counts, x-death, reply
// codes, which channel or connection closed); the test fails on the first
// line where the two traces differ, per seed. Without the variable it is
// skipped, so make test never needs a RabbitMQ.
//
// Env: WARREN_AMQP_DIFF_SEEDS (how many seeds, 40), WARREN_AMQP_DIFF_SEED
// (the first, 1), WARREN_AMQP_DIFF_ONLY (a scenario name: only that one),
// WARREN_AMQP_DIFF_QUIET_MS (how long a consumer must stay quiet before a
// step's deliveries are taken as complete, 150).
//
// Normalised away, as documented differences (README, "AMQP 0-9-1"):
// Warren's x-delivery-count header on non-quorum queues (and RabbitMQ's
// x-delivery-count 0 on a quorum queue's first delivery), x-death's time
// and original-expiration, the Erlang terms in RabbitMQ's "invalid arg"
// texts; not tried: a per-consumer prefetch size (Warren's byte prefetch,
// which RabbitMQ refuses), arguments RabbitMQ ignores and Warren refuses.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/amqp"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

// scenario is one kind of sequence; run draws its choices from r.
type scenario struct {
	name string
	run  func(e *env, r *rand.Rand)
}

var scenarios = []scenario{
	{"routing", scRouting},
	{"queue-ops", scQueueOps},
	{"ttl", scTTL},
	{"errors", scErrors},
	{"quorum-delivery-limit", scQuorumLimit},
}

func TestAMQPDiff(t *testing.T) {
	rabbit := os.Getenv("WARREN_AMQP_DIFF_RABBIT")
	if rabbit == "" {
		t.Skip("WARREN_AMQP_DIFF_RABBIT unset (make amqp-diff sets it)")
	}
	ncfg := netio.Config{Addr: "127.0.0.1:0", Shards: 2, EventLoops: 1, DataDir: t.TempDir()}
	srv, err := netio.Start(ncfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := amqp.Listen(srv, amqp.Config{Addr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close()
		_ = srv.Close(ctx)
	})
	warren := "amqp://guest:guest@" + l.Addr().String() + "/"
	seeds, first := envInt("WARREN_AMQP_DIFF_SEEDS", 40), envInt("WARREN_AMQP_DIFF_SEED", 1)
	quiet := time.Duration(envInt("WARREN_AMQP_DIFF_QUIET_MS", 150)) * time.Millisecond
	only := os.Getenv("WARREN_AMQP_DIFF_ONLY")
	run := strconv.FormatInt(time.Now().UnixNano()%1e6, 36)
	differ := 0
	for _, sc := range scenarios {
		if only != "" && sc.name != only {
			continue
		}
		for seed := first; seed < first+seeds; seed++ {
			pfx := fmt.Sprintf("d%s.%s.%d.", run, sc.name, seed)
			a := runOne(t, rabbit, pfx, quiet, sc, int64(seed))
			b := runOne(t, warren, pfx, quiet, sc, int64(seed))
			if i := firstDiff(a, b); i >= 0 {
				differ++
				t.Errorf("%s seed %d: differs at line %d\n%s", sc.name, seed, i, sideBySide(a, b, i, pfx))
			} else if testing.Verbose() {
				t.Logf("%s seed %d: %d lines the same", sc.name, seed, len(a))
			}
		}
	}
	if differ > 0 {
		t.Logf("%d scenario runs differ", differ)
	}
}

// erlangTerm is the tail of RabbitMQ's "invalid arg" and "invalid
// expiration" refusals, an Erlang term (or its own words) where Warren
// says what it wants (README: a documented difference); compared without
// it, up to the end of the text.
var erlangTerm = regexp.MustCompile(`((?:invalid arg '[^']*' for queue '[^']*' in vhost '[^']*')|(?:invalid expiration '[^']*')): .*?("? class \d+ method \d+$| \(connection closed \w+\)$|$)`)

func norm(s string) string { return erlangTerm.ReplaceAllString(s, "$1: …$2") }

func firstDiff(a, b []string) int {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || norm(a[i]) != norm(b[i]) {
			return i
		}
	}
	return -1
}

func sideBySide(a, b []string, at int, pfx string) string {
	var s strings.Builder
	lo := max(0, at-200)
	for i := lo; i < max(len(a), len(b)) && i < at+8; i++ {
		x, y := "", ""
		if i < len(a) {
			x = strings.ReplaceAll(a[i], pfx, "")
		}
		if i < len(b) {
			y = strings.ReplaceAll(b[i], pfx, "")
		}
		mark := "  "
		if norm(x) != norm(y) {
			mark = "!="
		}
		fmt.Fprintf(&s, "%s %3d rabbit: %s\n          warren: %s\n", mark, i, x, y)
	}
	return s.String()
}

func runOne(t *testing.T, url, pfx string, quiet time.Duration, sc scenario, seed int64) []string {
	t.Helper()
	e := &env{t: t, url: url, pfx: pfx, quiet: quiet}
	p, err := newProxy(e)
	if err != nil {
		t.Fatal(err)
	}
	e.proxy = p
	func() {
		defer func() {
			if v := recover(); v != nil {
				if _, ok := v.(abort); !ok {
					panic(v)
				}
			}
		}()
		sc.run(e, rand.New(rand.NewSource(seed)))
	}()
	e.cleanup()
	p.close()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.trace
}

type abort struct{}

// env is one scenario run against one broker.
type env struct {
	t     *testing.T
	url   string
	pfx   string
	quiet time.Duration
	proxy *proxy

	mu    sync.Mutex
	trace []string
	conns []*amqp091.Connection
	nconn int
	qs    []string
	xs    []string
}

func (e *env) log(format string, args ...any) {
	e.mu.Lock()
	e.trace = append(e.trace, fmt.Sprintf(format, args...))
	e.mu.Unlock()
}

func (e *env) fatal(format string, args ...any) {
	e.log("FATAL "+format, args...)
	panic(abort{})
}

func (e *env) q(name string) string {
	n := e.pfx + name
	e.qs = append(e.qs, n)
	return n
}

func (e *env) x(name string) string {
	n := e.pfx + name
	e.xs = append(e.xs, n)
	return n
}

func (e *env) conn() *amqp091.Connection {
	e.nconn++
	c, err := amqp091.Dial("amqp://guest:guest@" + e.proxy.addr() + "/")
	if err != nil {
		e.fatal("dial: %v", err)
	}
	e.conns = append(e.conns, c)
	return c
}

func (e *env) channel(c *amqp091.Connection) *amqp091.Channel {
	ch, err := c.Channel()
	if err != nil {
		e.fatal("channel: %v", err)
	}
	return ch
}

// res logs the outcome of a synchronous method: ok, or its error and
// whether the connection survived.
func (e *env) res(what string, c *amqp091.Connection, err error) bool {
	if err == nil {
		e.log("%s: ok", what)
		return true
	}
	e.log("%s: %s (connection closed %v)", what, errText(err), c.IsClosed())
	return false
}

func errText(err error) string {
	var ae *amqp091.Error
	if errors.As(err, &ae) {
		return fmt.Sprintf("%d %s", ae.Code, ae.Reason)
	}
	return err.Error()
}

func (e *env) cleanup() {
	for _, c := range e.conns {
		_ = c.CloseDeadline(time.Now().Add(5 * time.Second))
	}
	c, err := amqp091.Dial(e.url)
	if err != nil {
		e.t.Logf("cleanup dial %s: %v", e.url, err)
		return
	}
	defer c.Close()
	for _, q := range e.qs {
		if ch, err := c.Channel(); err == nil {
			_, _ = ch.QueueDelete(q, false, false, false)
			_ = ch.Close()
		}
	}
	for _, x := range e.xs {
		if ch, err := c.Channel(); err == nil {
			_ = ch.ExchangeDelete(x, false, false)
			_ = ch.Close()
		}
	}
}

// proxy forwards a scenario's connections to the broker and logs, in the
// trace, each channel.close and connection.close the broker sends, before
// the client can see it.
type proxy struct {
	e  *env
	ln net.Listener
	n  int
	wg sync.WaitGroup
}

func newProxy(e *env) (*proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	host := strings.TrimPrefix(e.url, "amqp://")
	host = host[strings.Index(host, "@")+1:]
	host = strings.TrimSuffix(host, "/")
	p := &proxy{e: e, ln: ln}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", host)
			if err != nil {
				_ = cc.Close()
				continue
			}
			p.n++
			id := p.n
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(sc, cc); _ = sc.(*net.TCPConn).CloseWrite() }()
			go func() { defer p.wg.Done(); p.frames(id, sc, cc); _ = cc.Close() }()
		}
	}()
	return p, nil
}

func (p *proxy) addr() string { return p.ln.Addr().String() }

func (p *proxy) close() {
	_ = p.ln.Close()
	p.wg.Wait()
}

func (p *proxy) frames(id int, from io.Reader, to io.Writer) {
	var h [7]byte
	for {
		if _, err := io.ReadFull(from, h[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(h[3:])
		body := make([]byte, n+1)
		if _, err := io.ReadFull(from, body); err != nil {
			return
		}
		if h[0] == 1 && n >= 4 {
			cm := [2]uint16{binary.BigEndian.Uint16(body), binary.BigEndian.Uint16(body[2:])}
			if cm == [2]uint16{20, 40} || cm == [2]uint16{10, 50} {
				a := body[4:n]
				code := binary.BigEndian.Uint16(a)
				tl := int(a[2])
				text := string(a[3 : 3+tl])
				ids := a[3+tl:]
				kind := "channel.close"
				if cm[0] == 10 {
					kind = "connection.close"
				}
				p.e.log("  broker sent %s on c%d/ch%d: %d %q class %d method %d", kind, id,
					binary.BigEndian.Uint16(h[1:]), code, text, binary.BigEndian.Uint16(ids), binary.BigEndian.Uint16(ids[2:]))
			}
		}
		if _, err := to.Write(h[:]); err != nil {
			return
		}
		if _, err := to.Write(body); err != nil {
			return
		}
	}
}

// Formatting of what a client sees.

func fmtVal(v any) string {
	switch v := v.(type) {
	case amqp091.Table:
		return fmtTable(v)
	case []any:
		s := make([]string, len(v))
		for i, x := range v {
			s[i] = fmtVal(x)
		}
		return "[" + strings.Join(s, " ") + "]"
	case []byte:
		return fmt.Sprintf("bytes:%q", v)
	default:
		return fmt.Sprintf("%T:%v", v, v)
	}
}

func fmtTable(t amqp091.Table) string {
	keys := make([]string, 0, len(t))
	for k := range t {
		switch k {
		case "time", "original-expiration":
			continue
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	s := make([]string, len(keys))
	for i, k := range keys {
		s[i] = k + "=" + fmtVal(t[k])
	}
	return "{" + strings.Join(s, " ") + "}"
}

func fmtMsg(d amqp091.Delivery, keepCount bool) string {
	h := amqp091.Table{}
	for k, v := range d.Headers {
		if k == "x-delivery-count" && (!keepCount || v == int64(0)) {
			continue // Warren: on every queue; RabbitMQ: quorum only, 0 on a first delivery
		}
		h[k] = v
	}
	s := fmt.Sprintf("tag=%d body=%s redelivered=%v exchange=%q key=%q", d.DeliveryTag, d.Body, d.Redelivered, d.Exchange, d.RoutingKey)
	if d.Priority != 0 {
		s += fmt.Sprintf(" priority=%d", d.Priority)
	}
	if d.Expiration != "" {
		s += " expiration=" + d.Expiration
	}
	if len(h) > 0 {
		s += " headers=" + fmtTable(h)
	}
	return s
}

// publisher is a confirm-mode channel that logs each publish's confirm
// and any return before it.
type publisher struct {
	e       *env
	c       *amqp091.Connection
	ch      *amqp091.Channel
	returns chan amqp091.Return
}

func (e *env) publisher(c *amqp091.Connection) *publisher {
	ch := e.channel(c)
	if err := ch.Confirm(false); err != nil {
		e.fatal("confirm.select: %v", err)
	}
	return &publisher{e: e, c: c, ch: ch, returns: ch.NotifyReturn(make(chan amqp091.Return, 1000))}
}

func (p *publisher) publish(ex, key string, mandatory bool, m amqp091.Publishing) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, ex, key, mandatory, false, m)
	if err != nil {
		p.e.log("publish %s to %q/%q: %s", m.Body, ex, key, errText(err))
		return
	}
	ack, err := dc.WaitContext(ctx)
	var rs []string
	for len(p.returns) > 0 {
		r := <-p.returns
		rs = append(rs, fmt.Sprintf("returned %d %s %s", r.ReplyCode, r.ReplyText, r.Body))
	}
	switch {
	case err != nil:
		p.e.log("publish %s to %q/%q: no confirm: %v %v", m.Body, ex, key, err, rs)
	case ack:
		p.e.log("publish %s to %q/%q: ack %v", m.Body, ex, key, rs)
	default:
		p.e.log("publish %s to %q/%q: nack %v", m.Body, ex, key, rs)
	}
}

// drain gets every message of q, logging each.
func (e *env) drain(c *amqp091.Connection, q string, keepCount bool) {
	e.drainCounted(c, q, keepCount, true)
}

// drainCounted is drain; counted false leaves out the count of messages
// left after each (with TTLs: RabbitMQ counts expired messages until
// they reach the head, Warren drops them where they are, documented).
func (e *env) drainCounted(c *amqp091.Connection, q string, keepCount, counted bool) {
	ch := e.channel(c)
	defer ch.Close()
	for i := 0; ; i++ {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			e.log("drain %s: %s", q, errText(err))
			return
		}
		if !ok {
			e.log("drain %s: %d messages", q, i)
			return
		}
		if counted {
			e.log("  %s: %s (%d left)", q, fmtMsg(d, keepCount), d.MessageCount)
		} else {
			e.log("  %s: %s", q, fmtMsg(d, keepCount))
		}
	}
}

// ---- routing: exchange kinds, bindings, alternate exchange, mandatory.

var words = []string{"a", "b", "c", ""}

func topicPattern(r *rand.Rand) string {
	switch r.Intn(12) {
	case 0:
		return "#"
	case 1:
		return "#.#"
	case 2:
		return ""
	case 3:
		return "*"
	case 4:
		return "." + words[r.Intn(3)]
	case 5:
		return words[r.Intn(3)] + "."
	}
	n := 1 + r.Intn(4)
	w := make([]string, n)
	for i := range w {
		switch k := r.Intn(7); k {
		case 0:
			w[i] = "#"
		case 1:
			w[i] = "*"
		default:
			w[i] = words[k%len(words)]
		}
	}
	return strings.Join(w, ".")
}

// topicKey makes a routing key; never the empty one (Warren: one empty
// word, which "*" matches; RabbitMQ: no words. A documented difference).
func topicKey(r *rand.Rand) string {
	switch r.Intn(10) {
	case 0:
		return "b"
	case 1:
		return "."
	case 2:
		return ".a"
	case 3:
		return "a."
	}
	n := 1 + r.Intn(4)
	w := make([]string, n)
	for i := range w {
		w[i] = words[r.Intn(len(words))]
	}
	if k := strings.Join(w, "."); k != "" {
		return k
	}
	return "b" // one empty word: the empty key
}

var headerVals = []any{"v1", "v2", int32(1), int32(2), "1", nil}

func headerTable(r *rand.Rand, forBinding bool) amqp091.Table {
	t := amqp091.Table{}
	for _, k := range []string{"h1", "h2", "x-h"} {
		if r.Intn(2) == 0 {
			continue
		}
		v := headerVals[r.Intn(len(headerVals))]
		if v == nil && !forBinding {
			v = "v1"
		}
		t[k] = v
	}
	if forBinding { // not all-with-x, any-with-x: Warren refuses them (documented)
		t["x-match"] = []string{"all", "any"}[r.Intn(2)]
	}
	return t
}

func scRouting(e *env, r *rand.Rand) {
	c := e.conn()
	ch := e.channel(c)
	kind := []string{"direct", "topic", "fanout", "headers"}[r.Intn(4)]
	x := e.x("x")
	var args amqp091.Table
	ae := r.Intn(3) == 0
	if ae {
		aex := e.x("ae")
		e.res("declare ae fanout", c, ch.ExchangeDeclare(aex, "fanout", false, false, false, false, nil))
		aq := e.q("aeq")
		_, err := ch.QueueDeclare(aq, false, false, false, false, nil)
		e.res("declare aeq", c, err)
		e.res("bind aeq", c, ch.QueueBind(aq, "", aex, false, nil))
		args = amqp091.Table{"alternate-exchange": aex}
	}
	e.log("exchange %s ae=%v", kind, ae)
	e.res("declare x", c, ch.ExchangeDeclare(x, kind, false, false, false, false, args))
	nq := 2 + r.Intn(3)
	qs := make([]string, nq)
	for i := range qs {
		qs[i] = e.q("q" + strconv.Itoa(i))
		_, err := ch.QueueDeclare(qs[i], false, false, false, false, nil)
		e.res("declare "+qs[i], c, err)
		for range 1 + r.Intn(2) {
			key, bargs := "", amqp091.Table(nil)
			switch kind {
			case "direct":
				key = words[r.Intn(len(words))]
			case "topic":
				key = topicPattern(r)
			case "fanout":
				key = words[r.Intn(len(words))]
			case "headers":
				bargs = headerTable(r, true)
			}
			e.log("bind q%d %q %s", i, key, fmtTable(bargs))
			if !e.res("bind", c, ch.QueueBind(qs[i], key, x, false, bargs)) {
				ch = e.channel(c)
			}
		}
	}
	p := e.publisher(c)
	for i := range 4 + r.Intn(6) {
		key, h := "", amqp091.Table(nil)
		switch kind {
		case "topic":
			key = topicKey(r)
		case "headers":
			h = headerTable(r, false)
		default:
			key = words[r.Intn(len(words))]
		}
		e.log("publish %d key %q headers %s", i, key, fmtTable(h))
		p.publish(x, key, r.Intn(2) == 0, amqp091.Publishing{Body: []byte("m" + strconv.Itoa(i)), Headers: h})
	}
	for i := range qs {
		e.drain(c, qs[i], false)
	}
	if ae {
		e.drain(c, e.pfx+"aeq", false)
	}
}

// ---- queue-ops: one queue, a random run of publishes, gets, consumes,
// acks, nacks, rejects, recovers, cancels, purges and channel closes.

type consumer struct {
	tag  string
	mu   sync.Mutex
	got  []amqp091.Delivery
	done chan struct{}
}

type opsState struct {
	e    *env
	c    *amqp091.Connection
	ch   *amqp091.Channel
	q    string
	cons []*consumer
	tags []uint64 // delivered on ch, not known to be settled
	ctag int
	// body is each tag's message; back the messages requeued and not
	// delivered since. While back holds any, nothing more is requeued:
	// Warren puts the later requeue at the head, RabbitMQ each message at
	// its place in publish order (a documented difference).
	body  map[uint64]string
	back  map[string]bool
	owner map[uint64]string // the consumer tag a delivery went to; "" for a get
}

func (s *opsState) reopen() {
	s.ch = s.e.channel(s.c)
	s.cons, s.tags = nil, nil
}

// took records a delivery or get-ok.
func (s *opsState) took(d amqp091.Delivery, unacked bool) {
	delete(s.back, string(d.Body))
	if unacked {
		s.tags = append(s.tags, d.DeliveryTag)
		s.body[d.DeliveryTag] = string(d.Body)
		s.owner[d.DeliveryTag] = d.ConsumerTag
	}
}

// safeRequeue says whether requeueing the picked unacked tags (as in
// requeueing) returns them where RabbitMQ does: none requeued before is
// waiting, they were delivered in publish order (Warren returns them in
// delivery order, RabbitMQ in publish order), and, for a channel's close,
// not both an active consumer's and others' (a get's, a cancelled
// consumer's: Warren returns the active consumer's ahead of those). The
// differences are documented; the driver does not requeue into them.
func (s *opsState) safeRequeue(tag uint64, multiple, closing bool) bool {
	active := map[string]bool{}
	for _, k := range s.cons {
		active[k.tag] = true
	}
	prev, any, act, other := -1, false, false, false
	for _, t := range s.tags {
		if tag != 0 && t != tag && !(multiple && t < tag) {
			continue
		}
		any = true
		n, _ := strconv.Atoi(strings.TrimPrefix(s.body[t], "m"))
		if n < prev {
			return false
		}
		prev = n
		if active[s.owner[t]] {
			act = true
		} else {
			other = true
		}
	}
	if !any {
		return true
	}
	return len(s.back) == 0 && !(closing && act && other)
}

// requeueing records that the unacked tags picked (tag, all up to it
// with multiple, or every one: tag 0) go back.
func (s *opsState) requeueing(tag uint64, multiple bool) {
	for _, t := range s.tags {
		if tag == 0 || t == tag || (multiple && t < tag) {
			s.back[s.body[t]] = true
		}
	}
}

// settle waits until no consumer of s receives anything for the quiet
// time, then logs what they received in order.
func (s *opsState) settle() {
	if len(s.cons) == 0 {
		return
	}
	count := func() int {
		n := 0
		for _, k := range s.cons {
			k.mu.Lock()
			n += len(k.got)
			k.mu.Unlock()
		}
		return n
	}
	last := count()
	for range 100 {
		time.Sleep(s.e.quiet)
		n := count()
		if n == last {
			break
		}
		last = n
	}
	for _, k := range s.cons {
		k.mu.Lock()
		got := k.got
		k.got = nil
		k.mu.Unlock()
		for _, d := range got {
			s.e.log("  deliver %s: %s", k.tag, fmtMsg(d, false))
			s.took(d, true)
		}
	}
}

func (s *opsState) pickTag(r *rand.Rand) (uint64, bool) {
	if len(s.tags) == 0 {
		return 0, false
	}
	i := r.Intn(len(s.tags))
	return s.tags[i], true
}

func (s *opsState) settled(tag uint64, multiple bool) {
	k := s.tags[:0]
	for _, t := range s.tags {
		if t == tag || (multiple && t < tag) {
			continue
		}
		k = append(k, t)
	}
	s.tags = k
}

func queueArgs(r *rand.Rand, e *env, c *amqp091.Connection, ch *amqp091.Channel) (amqp091.Table, string) {
	args := amqp091.Table{}
	if r.Intn(2) == 0 {
		args["x-max-length"] = int32(1 + r.Intn(4))
		if r.Intn(2) == 0 {
			args["x-overflow"] = []string{"drop-head", "reject-publish"}[r.Intn(2)]
		}
	}
	// Not drop-head with priorities: RabbitMQ drops the next message to
	// be delivered (the highest priority), Warren the oldest of the
	// lowest priority (a documented difference).
	if _, capped := args["x-max-length"]; r.Intn(3) == 0 && (!capped || args["x-overflow"] == "reject-publish") {
		args["x-max-priority"] = int32(1 + r.Intn(9))
	}
	dlq := ""
	if r.Intn(2) == 0 {
		dlx := e.x("dlx")
		dlq = e.q("dlq")
		e.res("declare dlx", c, ch.ExchangeDeclare(dlx, "fanout", false, false, false, false, nil))
		_, err := ch.QueueDeclare(dlq, false, false, false, false, nil)
		e.res("declare dlq", c, err)
		e.res("bind dlq", c, ch.QueueBind(dlq, "", dlx, false, nil))
		args["x-dead-letter-exchange"] = dlx
		if r.Intn(2) == 0 {
			args["x-dead-letter-routing-key"] = "dlk"
		}
	}
	return args, dlq
}

func scQueueOps(e *env, r *rand.Rand) {
	c := e.conn()
	s := &opsState{e: e, c: c, ch: e.channel(c), q: e.q("q"), body: map[uint64]string{}, back: map[string]bool{}, owner: map[uint64]string{}}
	args, dlq := queueArgs(r, e, c, s.ch)
	e.log("queue args %s", fmtTable(args))
	if _, err := s.ch.QueueDeclare(s.q, false, false, false, false, args); err != nil {
		e.fatal("declare: %s", errText(err))
	}
	// A requeue past x-max-length with drop-head: RabbitMQ drops from the
	// head at once, Warren at the next publish (a documented difference);
	// such a queue's messages are not requeued here.
	_, capped := args["x-max-length"]
	noRequeue := capped && args["x-overflow"] != "reject-publish"
	p := e.publisher(c)
	n := 0
	publish := func() {
		m := amqp091.Publishing{Body: []byte("m" + strconv.Itoa(n))}
		if _, ok := args["x-max-priority"]; ok || r.Intn(4) == 0 {
			m.Priority = uint8(r.Intn(12))
		}
		n++
		p.publish("", s.q, r.Intn(3) == 0, m)
	}
	for range 3 + r.Intn(4) {
		publish()
	}
	for step := range 14 + r.Intn(14) {
		var closed chan *amqp091.Error
		op := r.Intn(17)
		if op == 16 && r.Intn(3) != 0 {
			op = 14
		}
		if noRequeue && (op == 11 || op == 12 || op == 15 || op == 16) || op == 12 && !s.safeRequeue(0, true, false) ||
			(op == 15 || op == 16) && !s.safeRequeue(0, true, true) {
			op = 14
		}
		e.log("step %d op %d", step, op)
		switch op {
		case 0, 1, 2:
			for range 1 + r.Intn(3) {
				publish()
			}
		case 3, 4:
			noAck := r.Intn(3) == 0
			d, ok, err := s.ch.Get(s.q, noAck)
			switch {
			case err != nil:
				if e.res("get", c, err) || c.IsClosed() {
					e.fatal("connection closed")
				}
				s.reopen()
			case !ok:
				e.log("get noack=%v: empty", noAck)
			default:
				e.log("get noack=%v: %s (%d left)", noAck, fmtMsg(d, false), d.MessageCount)
				s.took(d, !noAck)
			}
		case 5:
			// One consumer at a time: which of two gets a message is
			// the brokers' scheduling, not compared.
			if len(s.cons) >= 1 {
				continue
			}
			pf := r.Intn(4)
			if err := s.ch.Qos(pf, 0, false); !e.res(fmt.Sprintf("qos %d", pf), c, err) {
				s.reopen()
				continue
			}
			s.ctag++
			k := &consumer{tag: "c" + strconv.Itoa(s.ctag), done: make(chan struct{})}
			ds, err := s.ch.Consume(s.q, k.tag, false, false, false, false, nil)
			if !e.res("consume "+k.tag, c, err) {
				s.reopen()
				continue
			}
			go func() {
				defer close(k.done)
				for d := range ds {
					k.mu.Lock()
					k.got = append(k.got, d)
					k.mu.Unlock()
				}
			}()
			s.cons = append(s.cons, k)
		case 6, 7:
			tag, ok := s.pickTag(r)
			if !ok {
				continue
			}
			multiple := r.Intn(3) == 0
			closed = s.ch.NotifyClose(make(chan *amqp091.Error, 1))
			e.log("ack %d multiple=%v: %v", tag, multiple, s.ch.Ack(tag, multiple))
			s.settled(tag, multiple)
		case 8, 9:
			tag, ok := s.pickTag(r)
			if !ok {
				continue
			}
			multiple := r.Intn(3) == 0
			requeue := r.Intn(2) == 0 && !noRequeue && s.safeRequeue(tag, multiple, false)
			if requeue {
				s.requeueing(tag, multiple)
			}
			closed = s.ch.NotifyClose(make(chan *amqp091.Error, 1))
			e.log("nack %d multiple=%v requeue=%v: %v", tag, multiple, requeue, s.ch.Nack(tag, multiple, requeue))
			s.settled(tag, multiple)
		case 10:
			tag, ok := s.pickTag(r)
			if !ok {
				continue
			}
			requeue := r.Intn(2) == 0 && !noRequeue && s.safeRequeue(tag, false, false)
			if requeue {
				s.requeueing(tag, false)
			}
			closed = s.ch.NotifyClose(make(chan *amqp091.Error, 1))
			e.log("reject %d requeue=%v: %v", tag, requeue, s.ch.Reject(tag, requeue))
			s.settled(tag, false)
		case 11:
			if len(s.cons) == 0 {
				continue
			}
			i := r.Intn(len(s.cons))
			k := s.cons[i]
			e.res("cancel "+k.tag, c, s.ch.Cancel(k.tag, false))
			<-k.done
			k.mu.Lock()
			for _, d := range k.got { // delivered before the cancel-ok
				e.log("  deliver %s: %s", k.tag, fmtMsg(d, false))
				s.took(d, true)
			}
			k.mu.Unlock()
			s.cons = append(s.cons[:i], s.cons[i+1:]...)
		case 12:
			s.requeueing(0, true)
			e.res("recover", c, s.ch.Recover(true))
			s.tags = nil
		case 13:
			k, err := s.ch.QueuePurge(s.q, false)
			e.log("purge: %d %v", k, err)
			clear(s.back)
		case 14:
			q, err := s.ch.QueueDeclarePassive(s.q, false, false, false, false, args)
			e.log("passive: messages %d consumers %d %v", q.Messages, q.Consumers, err)
		case 15:
			s.requeueing(0, true)
			e.log("close channel: %v", s.ch.Close())
			for _, k := range s.cons {
				<-k.done
			}
			s.reopen()
		case 16:
			s.requeueing(0, true)
			closed = s.ch.NotifyClose(make(chan *amqp091.Error, 1))
			e.log("ack unknown tag 999")
			if err := s.ch.Ack(999, false); err != nil {
				e.log("  %v", err)
			}
		}
		if closed != nil {
			// An ack, nack or reject of a bad tag shows only as the channel
			// closing: a synchronous method behind it tells which.
			_, err := s.ch.QueueDeclarePassive(s.q, false, false, false, false, args)
			if err != nil {
				// The close's code and text are the proxy's line: the
				// client may see it, or 504 if it closed before the call.
				e.log("after it: channel closed")
				if c.IsClosed() {
					e.fatal("connection closed")
				}
				for _, k := range s.cons {
					<-k.done
				}
				s.reopen()
				continue
			}
		}
		s.settle()
	}
	e.log("end")
	if (noRequeue || !s.safeRequeue(0, true, true)) && len(s.tags) > 0 {
		e.log("nack all: %v", s.ch.Nack(0, true, false))
	}
	e.log("close channel: %v", s.ch.Close())
	for _, k := range s.cons {
		<-k.done
	}
	s.cons = nil
	e.drain(c, s.q, false)
	if dlq != "" {
		e.drainSorted(c, dlq)
	}
}

// drainSorted gets every message of q and logs them sorted: the order of
// dead letters is not compared (RabbitMQ dead-letters a nack with
// multiple's messages last first, Warren in delivery order).
func (e *env) drainSorted(c *amqp091.Connection, q string) {
	ch := e.channel(c)
	defer ch.Close()
	var got []string
	for {
		d, ok, err := ch.Get(q, true)
		if err != nil {
			e.log("drain %s: %s", q, errText(err))
			return
		}
		if !ok {
			break
		}
		d.DeliveryTag = 0
		got = append(got, fmtMsg(d, false))
	}
	sort.Strings(got)
	for _, m := range got {
		e.log("  %s: %s", q, m)
	}
	e.log("drain %s: %d messages", q, len(got))
}

// ---- ttl: per-queue and per-message TTL, expired messages dead-lettered,
// with generous margins (expiry at 100 ms, looked at after 1 s).

func scTTL(e *env, r *rand.Rand) {
	c := e.conn()
	ch := e.channel(c)
	args := amqp091.Table{}
	if r.Intn(2) == 0 {
		args["x-message-ttl"] = int32(100)
	}
	dlx := e.x("dlx")
	dlq := e.q("dlq")
	e.res("declare dlx", c, ch.ExchangeDeclare(dlx, "direct", false, false, false, false, nil))
	_, err := ch.QueueDeclare(dlq, false, false, false, false, nil)
	e.res("declare dlq", c, err)
	e.res("bind dlq", c, ch.QueueBind(dlq, "#", dlx, false, nil))
	e.res("bind dlq", c, ch.QueueBind(dlq, "dlk", dlx, false, nil))
	q := e.q("q")
	if r.Intn(4) != 0 {
		args["x-dead-letter-exchange"] = dlx
		if r.Intn(2) == 0 {
			args["x-dead-letter-routing-key"] = "dlk"
		} else {
			e.res("bind dlq q", c, ch.QueueBind(dlq, q, dlx, false, nil))
		}
	}
	e.log("args %s", fmtTable(args))
	_, err = ch.QueueDeclare(q, false, false, false, false, args)
	e.res("declare q", c, err)
	p := e.publisher(c)
	for i := range 3 + r.Intn(5) {
		m := amqp091.Publishing{Body: []byte("m" + strconv.Itoa(i))}
		switch r.Intn(3) {
		case 0:
			m.Expiration = "100"
		case 1:
			m.Expiration = "600000"
		}
		p.publish("", q, false, m)
	}
	time.Sleep(time.Second)
	e.drainCounted(c, q, false, false)
	e.drainCounted(c, dlq, false, false)
	// Rejected, dead-lettered, republished by the client, rejected again.
	// Republished without the x-death the client got: Warren does not
	// carry a publisher's x-death on (RabbitMQ 3.10 counts on from it, a
	// documented difference).
	if _, ok := args["x-dead-letter-exchange"]; ok && r.Intn(2) == 0 {
		p.publish("", q, false, amqp091.Publishing{Body: []byte("r")})
		for range 2 {
			d, ok, err := ch.Get(q, false)
			if err != nil || !ok {
				e.log("get: %v %v", ok, err)
				return
			}
			e.log("reject: %v", d.Reject(false))
			// RabbitMQ dead-letters after the reject, not before its
			// next call: the dead-letter queue's count is polled (up to
			// 5 s).
			for range 250 {
				if dq, err := ch.QueueDeclarePassive(dlq, false, false, false, false, nil); err != nil || dq.Messages > 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			d, ok, err = ch.Get(dlq, true)
			e.log("dlq got %v %v: %s", ok, err, fmtMsg(d, false))
			if ok {
				h := amqp091.Table{}
				for k, v := range d.Headers {
					if !strings.HasPrefix(k, "x-") {
						h[k] = v
					}
				}
				p.publish("", q, false, amqp091.Publishing{Body: d.Body, Headers: h})
			}
		}
		e.drain(c, q, false)
	}
}

// ---- errors: refusals, their codes, texts, class and method ids, and
// whether the channel or the connection closes.

func scErrors(e *env, r *rand.Rand) {
	c := e.conn()
	type check struct {
		name string
		do   func(ch *amqp091.Channel) error
	}
	q := e.q("q")
	x := e.x("x")
	ex := e.q("excl")
	other := e.conn()
	och := e.channel(other)
	if _, err := och.QueueDeclare(ex, false, false, true, false, nil); err != nil {
		e.fatal("declare exclusive: %v", err)
	}
	setup := e.channel(c)
	if _, err := setup.QueueDeclare(q, false, false, false, false, amqp091.Table{"x-max-length": int32(5)}); err != nil {
		e.fatal("declare q: %v", err)
	}
	if err := setup.ExchangeDeclare(x, "direct", false, false, false, false, nil); err != nil {
		e.fatal("declare x: %v", err)
	}
	if err := setup.Publish("", q, false, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
		e.fatal("publish: %v", err)
	}
	checks := []check{
		{"passive missing queue", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclarePassive(e.pfx+"missing", false, false, false, false, nil)
			return err
		}},
		{"passive missing exchange", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclarePassive(e.pfx+"missingx", "direct", false, false, false, false, nil)
		}},
		{"redeclare other max-length", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(q, false, false, false, false, amqp091.Table{"x-max-length": int32(6)})
			return err
		}},
		{"redeclare without args", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(q, false, false, false, false, nil)
			return err
		}},
		{"redeclare durable", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(q, true, false, false, false, amqp091.Table{"x-max-length": int32(5)})
			return err
		}},
		{"redeclare auto-delete", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(q, false, true, false, false, amqp091.Table{"x-max-length": int32(5)})
			return err
		}},
		{"redeclare max-length as long", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(q, false, false, false, false, amqp091.Table{"x-max-length": int64(5)})
			return err
		}},
		{"redeclare exchange kind", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare(x, "topic", false, false, false, false, nil)
		}},
		{"redeclare exchange durable", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare(x, "direct", true, false, false, false, nil)
		}},
		{"declare exchange bad kind", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare(e.pfx+"badkind", "nokind", false, false, false, false, nil)
		}},
		{"declare amq. queue", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare("amq.diff", false, false, false, false, nil)
			return err
		}},
		{"declare amq. exchange", func(ch *amqp091.Channel) error {
			return ch.ExchangeDeclare("amq.diff", "direct", false, false, false, false, nil)
		}},
		{"exclusive declare", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(ex, false, false, true, false, nil)
			return err
		}},
		{"exclusive passive", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclarePassive(ex, false, false, true, false, nil)
			return err
		}},
		{"exclusive consume", func(ch *amqp091.Channel) error {
			_, err := ch.Consume(ex, "", false, false, false, false, nil)
			return err
		}},
		{"exclusive get", func(ch *amqp091.Channel) error {
			_, _, err := ch.Get(ex, false)
			return err
		}},
		{"exclusive bind", func(ch *amqp091.Channel) error { return ch.QueueBind(ex, "k", x, false, nil) }},
		{"exclusive purge", func(ch *amqp091.Channel) error { _, err := ch.QueuePurge(ex, false); return err }},
		{"exclusive delete", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDelete(ex, false, false, false)
			return err
		}},
		{"delete if-empty", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDelete(q, false, true, false)
			return err
		}},
		{"delete if-unused", func(ch *amqp091.Channel) error {
			if _, err := ch.Consume(q, "held", false, false, false, false, nil); err != nil {
				return err
			}
			_, err := ch.QueueDelete(q, true, false, false)
			return err
		}},
		{"delete missing queue", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDelete(e.pfx+"missing", false, false, false)
			return err
		}},
		{"delete missing exchange", func(ch *amqp091.Channel) error {
			return ch.ExchangeDelete(e.pfx+"missingx", false, false)
		}},
		{"delete default exchange", func(ch *amqp091.Channel) error { return ch.ExchangeDelete("", false, false) }},
		{"delete amq.direct", func(ch *amqp091.Channel) error { return ch.ExchangeDelete("amq.direct", false, false) }},
		{"bind to missing exchange", func(ch *amqp091.Channel) error {
			return ch.QueueBind(q, "k", e.pfx+"missingx", false, nil)
		}},
		{"bind missing queue", func(ch *amqp091.Channel) error {
			return ch.QueueBind(e.pfx+"missing", "k", x, false, nil)
		}},
		{"bind missing queue to missing exchange", func(ch *amqp091.Channel) error {
			return ch.QueueBind(e.pfx+"missing", "k", e.pfx+"missingx", false, nil)
		}},
		{"exchange bind missing destination", func(ch *amqp091.Channel) error {
			return ch.ExchangeBind(e.pfx+"missingx", "k", x, false, nil)
		}},
		{"exchange bind missing source", func(ch *amqp091.Channel) error {
			return ch.ExchangeBind(x, "k", e.pfx+"missingx", false, nil)
		}},
		{"exchange unbind missing", func(ch *amqp091.Channel) error {
			return ch.ExchangeUnbind(x, "k", e.pfx+"missingx", false, nil)
		}},
		{"bind to default exchange", func(ch *amqp091.Channel) error { return ch.QueueBind(q, "k", "", false, nil) }},
		{"unbind missing binding", func(ch *amqp091.Channel) error { return ch.QueueUnbind(q, "nokey", x, nil) }},
		{"consume missing queue", func(ch *amqp091.Channel) error {
			_, err := ch.Consume(e.pfx+"missing", "", false, false, false, false, nil)
			return err
		}},
		{"get missing queue", func(ch *amqp091.Channel) error { _, _, err := ch.Get(e.pfx+"missing", false); return err }},
		{"purge missing queue", func(ch *amqp091.Channel) error { _, err := ch.QueuePurge(e.pfx+"missing", false); return err }},
		{"bad max-length type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-max-length": "abc"})
			return err
		}},
		{"negative max-length", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-max-length": int32(-1)})
			return err
		}},
		{"bad overflow", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-overflow": "nope"})
			return err
		}},
		{"max-priority too big", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-max-priority": int32(300)})
			return err
		}},
		{"ack unknown tag", func(ch *amqp091.Channel) error {
			closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
			if err := ch.Ack(7, false); err != nil {
				return err
			}
			if _, err := ch.QueueDeclarePassive(q, false, false, false, false, nil); err != nil {
				return err
			}
			select {
			case err := <-closed:
				return err
			default:
				return nil
			}
		}},
		{"ack twice", func(ch *amqp091.Channel) error {
			d, ok, err := ch.Get(q, false)
			if err != nil || !ok {
				return fmt.Errorf("get: %v %v", ok, err)
			}
			_ = d.Ack(false)
			_ = d.Ack(false)
			_, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
			return err
		}},
		{"publish to missing exchange", func(ch *amqp091.Channel) error {
			closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
			_ = ch.Publish(e.pfx+"missingx", "k", false, false, amqp091.Publishing{Body: []byte("x")})
			select {
			case err := <-closed:
				return err
			case <-time.After(5 * time.Second):
				return errors.New("no close")
			}
		}},
		{"duplicate consumer tag", func(ch *amqp091.Channel) error {
			if _, err := ch.Consume(q, "dup", false, false, false, false, nil); err != nil {
				return err
			}
			_, err := ch.Consume(q, "dup", false, false, false, false, nil)
			return err
		}},
		{"exclusive consumer then another", func(ch *amqp091.Channel) error {
			if _, err := ch.Consume(q, "ex1", false, true, false, false, nil); err != nil {
				return err
			}
			ch2, err := c.Channel()
			if err != nil {
				return err
			}
			_, err = ch2.Consume(q, "ex2", false, false, false, false, nil)
			return err
		}},
		{"recover requeue false", func(ch *amqp091.Channel) error { return ch.Recover(false) }},
		{"flow false", func(ch *amqp091.Channel) error { return ch.Flow(false) }},
		{"tx then confirm", func(ch *amqp091.Channel) error {
			if err := ch.Tx(); err != nil {
				return err
			}
			return ch.Confirm(false)
		}},
		{"commit without tx", func(ch *amqp091.Channel) error { return ch.TxCommit() }},
		{"ttl negative", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-message-ttl": int32(-5)})
			return err
		}},
		{"bad expiration", func(ch *amqp091.Channel) error {
			closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
			_ = ch.Publish("", q, false, false, amqp091.Publishing{Body: []byte("x"), Expiration: "soon"})
			select {
			case err := <-closed:
				return err
			case <-time.After(5 * time.Second):
				return errors.New("no close")
			}
		}},
		{"bad dlx type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-dead-letter-exchange": int32(1)})
			return err
		}},
		{"bad dlrk type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-dead-letter-exchange": "d", "x-dead-letter-routing-key": int32(1)})
			return err
		}},
		{"bad overflow type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-overflow": int32(1)})
			return err
		}},
		{"bad queue-type type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-queue-type": int32(1)})
			return err
		}},
		{"bad single-active type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-single-active-consumer": "yes"})
			return err
		}},
		{"bad expires type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-expires": "soon"})
			return err
		}},
		{"bad priority type", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-max-priority": "hi"})
			return err
		}},
		{"dl routing key without dlx", func(ch *amqp091.Channel) error {
			_, err := ch.QueueDeclare(e.pfx+"badarg", false, false, false, false, amqp091.Table{"x-dead-letter-routing-key": "k"})
			return err
		}},
	}
	e.qs = append(e.qs, e.pfx+"badarg")
	e.xs = append(e.xs, e.pfx+"badkind")
	r.Shuffle(len(checks), func(i, j int) { checks[i], checks[j] = checks[j], checks[i] })
	for _, k := range checks[:8+r.Intn(8)] {
		if c.IsClosed() {
			c = e.conn()
		}
		ch, err := c.Channel()
		if err != nil {
			e.fatal("channel: %v", err)
		}
		e.res(k.name, c, k.do(ch))
		if !c.IsClosed() {
			_ = ch.Close()
		}
		// What a check left behind must not change the next: its queue
		// state is reset (the held consumers went with their channel).
		if !c.IsClosed() {
			if ch, err := c.Channel(); err == nil {
				_, _ = ch.QueueDelete(e.pfx+"badarg", false, false, false)
				_ = ch.Close()
			}
		}
	}
}

// ---- quorum: x-delivery-limit and the delivery count, where Warren
// claims quorum semantics (x-queue-type quorum).

func scQuorumLimit(e *env, r *rand.Rand) {
	c := e.conn()
	ch := e.channel(c)
	dlx := e.x("dlx")
	dlq := e.q("dlq")
	e.res("declare dlx", c, ch.ExchangeDeclare(dlx, "fanout", false, false, false, false, nil))
	_, err := ch.QueueDeclare(dlq, false, false, false, false, nil)
	e.res("declare dlq", c, err)
	e.res("bind dlq", c, ch.QueueBind(dlq, "", dlx, false, nil))
	q := e.q("q")
	limit := 1 + r.Intn(3)
	args := amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": int32(limit), "x-dead-letter-exchange": dlx}
	_, err = ch.QueueDeclare(q, true, false, false, false, args)
	if !e.res(fmt.Sprintf("declare quorum limit %d", limit), c, err) {
		return
	}
	p := e.publisher(c)
	for i := range 2 + r.Intn(3) {
		p.publish("", q, false, amqp091.Publishing{Body: []byte("m" + strconv.Itoa(i)), DeliveryMode: 2})
	}
	for range 4 + r.Intn(8) {
		d, ok, err := ch.Get(q, false)
		if err != nil {
			e.log("get: %s", errText(err))
			return
		}
		if !ok {
			e.log("get: empty")
			break
		}
		e.log("get: %s", fmtMsg(d, true))
		switch r.Intn(3) {
		case 0:
			e.log("nack requeue: %v", d.Nack(false, true))
		case 1:
			e.log("reject requeue: %v", d.Reject(true))
		case 2:
			e.log("ack: %v", d.Ack(false))
		}
	}
	e.drain(c, q, true)
	e.drain(c, dlq, true)
}
