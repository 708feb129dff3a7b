package amqp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/amqp"
)

// qdecl is one queue.declare's settings.
type qdecl struct {
	durable, autoDelete, exclusive bool
	args                           amqp091.Table
}

// A redeclare that differs is refused with RabbitMQ's reply code and
// words (each text below is what RabbitMQ 3.10 answered to the same
// declares, amqp091-go sending ints as signedint), the first difference
// in RabbitMQ's order: exclusive, durable, auto_delete, then the
// arguments. x-queue-type classic is the same as none; quorum is kept.
func TestRedeclareEquivalenceAsRabbitMQ(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, _ := dial(t, url)
	quorum := amqp091.Table{"x-queue-type": "quorum"}
	classic := amqp091.Table{"x-queue-type": "classic"}
	for _, tc := range []struct {
		name        string
		first, then qdecl
		code        int
		text        string
	}{
		{"e.durable", qdecl{}, qdecl{durable: true}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'durable' for queue 'e.durable' in vhost '/': received 'true' but current is 'false'"},
		{"e.autodel", qdecl{}, qdecl{autoDelete: true}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for queue 'e.autodel' in vhost '/': received 'true' but current is 'false'"},
		{"e.c-to-q", qdecl{durable: true}, qdecl{durable: true, args: quorum}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'e.c-to-q' in vhost '/': received the value 'quorum' of type 'longstr' but current is none"},
		{"e.q-to-none", qdecl{durable: true, args: quorum}, qdecl{durable: true}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'e.q-to-none' in vhost '/': received none but current is the value 'quorum' of type 'longstr'"},
		{"e.q-to-c", qdecl{durable: true, args: quorum}, qdecl{durable: true, args: classic}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-queue-type' for queue 'e.q-to-c' in vhost '/': received 'classic' but current is 'quorum'"},
		{"e.q-to-q", qdecl{durable: true, args: quorum}, qdecl{durable: true, args: quorum}, 0, ""},
		{"e.none-to-c", qdecl{durable: true}, qdecl{durable: true, args: classic}, 0, ""},
		{"e.c-to-none", qdecl{durable: true, args: classic}, qdecl{durable: true}, 0, ""},
		{"e.ttl", qdecl{args: amqp091.Table{"x-message-ttl": int32(1000)}}, qdecl{args: amqp091.Table{"x-message-ttl": int32(2000)}}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-message-ttl' for queue 'e.ttl' in vhost '/': received '2000' but current is '1000'"},
		{"e.ttl-width", qdecl{args: amqp091.Table{"x-message-ttl": int32(1000)}}, qdecl{args: amqp091.Table{"x-message-ttl": int64(1000)}}, 0, ""},
		{"e.maxlen-none", qdecl{args: amqp091.Table{"x-max-length": int32(10)}}, qdecl{}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-max-length' for queue 'e.maxlen-none' in vhost '/': received none but current is the value '10' of type 'signedint'"},
		{"e.none-prio", qdecl{}, qdecl{args: amqp091.Table{"x-max-priority": int32(5)}}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-max-priority' for queue 'e.none-prio' in vhost '/': received the value '5' of type 'signedint' but current is none"},
		{"e.dlx", qdecl{args: amqp091.Table{"x-dead-letter-exchange": "a"}}, qdecl{args: amqp091.Table{"x-dead-letter-exchange": "b"}}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-dead-letter-exchange' for queue 'e.dlx' in vhost '/': received 'b' but current is 'a'"},
		{"e.sac", qdecl{args: amqp091.Table{"x-single-active-consumer": true}}, qdecl{args: amqp091.Table{"x-single-active-consumer": false}}, 406,
			"PRECONDITION_FAILED - inequivalent arg 'x-single-active-consumer' for queue 'e.sac' in vhost '/': received 'false' but current is 'true'"},
		{"e.excl", qdecl{autoDelete: true}, qdecl{autoDelete: true, exclusive: true}, 405,
			"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'e.excl' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration."},
	} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ch.QueueDeclare(tc.name, tc.first.durable, tc.first.autoDelete, tc.first.exclusive, false, tc.first.args); err != nil {
			t.Fatalf("%s: first declare: %v", tc.name, err)
		}
		_, err = ch.QueueDeclare(tc.name, tc.then.durable, tc.then.autoDelete, tc.then.exclusive, false, tc.then.args)
		if tc.code == 0 {
			if err != nil {
				t.Errorf("%s: redeclare: %v, want it accepted", tc.name, err)
			}
			continue
		}
		var e *amqp091.Error
		if !errors.As(err, &e) || e.Code != tc.code || e.Reason != tc.text {
			t.Errorf("%s: redeclare: %v\nwant (%d) %q", tc.name, err, tc.code, tc.text)
		}
	}
	// Another connection's exclusive queue: the same 405.
	ch, _ := conn.Channel()
	if _, err := ch.QueueDeclare("e.mine", false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	_, other := dial(t, url)
	_, err := other.QueueDeclare("e.mine", false, true, true, false, nil)
	var e *amqp091.Error
	if want := "RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'e.mine' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration."; !errors.As(err, &e) || e.Code != 405 || e.Reason != want {
		t.Errorf("another connection's exclusive queue: %v\nwant (405) %q", err, want)
	}
}

// amqp091-go writes a table in Go's map order, a new one each time: a
// redeclare with the same arguments in another order is the same
// declaration (it was refused as "in order or repetition").
func TestRedeclareArgumentsInAnyOrder(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	args := amqp091.Table{"x-message-ttl": int32(60000), "x-max-length": int32(100), "x-max-priority": int32(5),
		"x-dead-letter-exchange": "dlx", "x-overflow": "reject-publish", "x-expires": int32(600000)}
	for i := 0; i < 20; i++ { // 720 orders: 20 in one order by chance is about 1 in 10^57
		if _, err := ch.QueueDeclare("anyorder", false, false, false, false, args); err != nil {
			t.Fatalf("declare %d: %v", i, err)
		}
	}
}

// Exchanges: type, durable, auto_delete, internal, alternate-exchange, in
// RabbitMQ's words.
func TestExchangeRedeclareEquivalenceAsRabbitMQ(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, _ := dial(t, url)
	type xdecl struct {
		kind                          string
		durable, autoDelete, internal bool
		args                          amqp091.Table
	}
	for _, tc := range []struct {
		name        string
		first, then xdecl
		text        string
	}{
		{"x.type", xdecl{kind: "direct"}, xdecl{kind: "fanout"},
			"PRECONDITION_FAILED - inequivalent arg 'type' for exchange 'x.type' in vhost '/': received 'fanout' but current is 'direct'"},
		{"x.durable", xdecl{kind: "direct"}, xdecl{kind: "direct", durable: true},
			"PRECONDITION_FAILED - inequivalent arg 'durable' for exchange 'x.durable' in vhost '/': received 'true' but current is 'false'"},
		{"x.autodel", xdecl{kind: "direct", autoDelete: true}, xdecl{kind: "direct"},
			"PRECONDITION_FAILED - inequivalent arg 'auto_delete' for exchange 'x.autodel' in vhost '/': received 'false' but current is 'true'"},
		{"x.internal", xdecl{kind: "direct", internal: true}, xdecl{kind: "direct"},
			"PRECONDITION_FAILED - inequivalent arg 'internal' for exchange 'x.internal' in vhost '/': received 'false' but current is 'true'"},
		{"x.ae", xdecl{kind: "direct"}, xdecl{kind: "direct", args: amqp091.Table{"alternate-exchange": "ae"}},
			"PRECONDITION_FAILED - inequivalent arg 'alternate-exchange' for exchange 'x.ae' in vhost '/': received the value 'ae' of type 'longstr' but current is none"},
	} {
		ch, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		f, n := tc.first, tc.then
		if err := ch.ExchangeDeclare(tc.name, f.kind, f.durable, f.autoDelete, f.internal, false, f.args); err != nil {
			t.Fatalf("%s: first declare: %v", tc.name, err)
		}
		err = ch.ExchangeDeclare(tc.name, n.kind, n.durable, n.autoDelete, n.internal, false, n.args)
		var e *amqp091.Error
		if !errors.As(err, &e) || e.Code != 406 || e.Reason != tc.text {
			t.Errorf("%s: redeclare: %v\nwant (406) %q", tc.name, err, tc.text)
		}
	}
}

// Invalid arguments name the argument and the queue as RabbitMQ does.
func TestInvalidArgumentsAsRabbitMQ(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	check := func(err error, code int, text string) {
		t.Helper()
		var e *amqp091.Error
		if !errors.As(err, &e) || e.Code != code || e.Reason != text {
			t.Errorf("%v\nwant (%d) %q", err, code, text)
		}
		ch, _ = conn.Channel()
	}
	_, err := ch.QueueDeclare("qq", false, false, false, false, amqp091.Table{"x-queue-type": "quorum"})
	check(err, 406, "PRECONDITION_FAILED - invalid property 'non-durable' for queue 'qq' in vhost '/'")
	_, err = ch.QueueDeclare("qq", true, false, true, false, amqp091.Table{"x-queue-type": "quorum"})
	check(err, 406, "PRECONDITION_FAILED - invalid property 'exclusive-owner' for queue 'qq' in vhost '/'")
	_, err = ch.QueueDeclare("qq", true, true, false, false, amqp091.Table{"x-queue-type": "quorum"})
	check(err, 406, "PRECONDITION_FAILED - invalid property 'auto-delete' for queue 'qq' in vhost '/'")
	_, err = ch.QueueDeclare("sq", true, false, false, false, amqp091.Table{"x-queue-type": "bogus"})
	check(err, 406, "PRECONDITION_FAILED - invalid arg 'x-queue-type' for queue 'sq' in vhost '/': \"unsupported queue type 'bogus'\"")
	// RabbitMQ: "...: routing_key_but_no_dlx_defined" (found by make amqp-diff).
	_, err = ch.QueueDeclare("dk", false, false, false, false, amqp091.Table{"x-dead-letter-routing-key": "k"})
	check(err, 406, "PRECONDITION_FAILED - invalid arg 'x-dead-letter-routing-key' for queue 'dk' in vhost '/': \"x-dead-letter-exchange is not set\"")
	_, err = ch.QueueDeclare("dt", false, false, false, false, amqp091.Table{"x-dead-letter-exchange": int32(1)})
	check(err, 406, "PRECONDITION_FAILED - invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'dt' in vhost '/'")
	if _, err := ch.QueueDeclare("cp", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, err = ch.Consume("cp", "", false, false, false, false, amqp091.Table{"x-priority": "high"})
	check(err, 406, "PRECONDITION_FAILED - invalid arg 'x-priority' for queue 'cp' in vhost '/': \"expected integer, got longstr\"")
}

// queue.unbind and exchange.unbind of a binding that is not there are
// answered with unbind-ok, as RabbitMQ 3.10 answers them (a cleanup that
// runs twice must not lose its channel).
func TestUnbindIsIdempotent(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("ub.q", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("ub.x", "direct", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueUnbind("ub.q", "k", "ub.x", nil); err != nil {
		t.Errorf("queue.unbind of no binding: %v", err)
	}
	if err := ch.QueueUnbind("ub.q", "k", "ub.none", nil); err != nil {
		t.Errorf("queue.unbind from no exchange: %v", err)
	}
	if err := ch.ExchangeUnbind("ub.x", "k", "amq.direct", false, nil); err != nil {
		t.Errorf("exchange.unbind of no binding: %v", err)
	}
	if _, err := ch.QueueDeclarePassive("ub.q", false, true, false, false, nil); err != nil {
		t.Errorf("the channel was closed: %v", err)
	}
}

// A headers binding's arguments come in Go's map order from amqp091-go:
// an unbind with the same arguments removes the binding whatever their
// order (it removed none, and bindings piled up).
func TestBindingArgumentsInAnyOrder(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("hb.q", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.ExchangeDeclare("hb.x", "headers", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	args := amqp091.Table{"x-match": "all", "a": "1", "b": "2", "c": "3", "d": "4"}
	for i := 0; i < 10; i++ {
		if err := ch.QueueBind("hb.q", "", "hb.x", false, args); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.QueueUnbind("hb.q", "", "hb.x", args); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 1))
	if err := ch.PublishWithContext(context.Background(), "hb.x", "", false, false,
		amqp091.Publishing{Headers: amqp091.Table{"a": "1", "b": "2", "c": "3", "d": "4"}, Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-confirms:
	case <-time.After(deadline):
		t.Fatal("no confirm")
	}
	if _, ok, err := ch.Get("hb.q", true); err != nil || ok {
		t.Fatalf("get after the unbind: got a message=%v, %v; want none (the binding is gone)", ok, err)
	}
}

// Under the disk alarm a publishing connection is blocked as under the
// memory alarm, and connection.blocked says why as RabbitMQ does: "low
// on disk".
func TestBlockedUnderDiskAlarm(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	var free atomic.Int64
	free.Store(1 << 20) // below the limit from the start
	srv, _, url := startWith(t, netio.Config{TickInterval: 5 * time.Millisecond, DiskFreeLimit: 1 << 30,
		DiskCheckInterval: time.Millisecond, DiskFree: func() (int64, bool) { return free.Load(), true }}, amqp.Config{})
	for end := time.Now().Add(deadline); !srv.DiskAlarm(); { // raised on the server's first tick
		if time.Now().After(end) {
			t.Fatal("the disk alarm is not on")
		}
		runtime.Gosched()
	}
	conn, ch := dial(t, url)
	blocked := conn.NotifyBlocked(make(chan amqp091.Blocking, 4))
	if _, err := ch.QueueDeclare("d", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	confirms := ch.NotifyPublish(make(chan amqp091.Confirmation, 1))
	if err := ch.PublishWithContext(context.Background(), "", "d", false, false, amqp091.Publishing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-blocked:
		if !b.Active || b.Reason != "low on disk" {
			t.Fatalf("got %+v, want connection.blocked \"low on disk\"", b)
		}
	case <-time.After(deadline):
		t.Fatal("no connection.blocked")
	}
	select {
	case c := <-confirms:
		t.Fatalf("confirmed under the disk alarm: %+v", c)
	default:
	}
	free.Store(10 << 30)
	select {
	case b := <-blocked:
		if b.Active {
			t.Fatalf("got %+v, want connection.unblocked", b)
		}
	case <-time.After(deadline):
		t.Fatal("no connection.unblocked")
	}
	select {
	case c := <-confirms:
		if !c.Ack {
			t.Fatalf("nacked: %+v", c)
		}
	case <-time.After(deadline):
		t.Fatal("no confirm after the alarm cleared")
	}
}

// Refusals with RabbitMQ's reply codes and words (each text is what
// RabbitMQ 3.10.8 answered to the same calls).
func TestRefusalsInRabbitMQWords(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	check := func(what string, err error, code int, text string) {
		t.Helper()
		var e *amqp091.Error
		if !errors.As(err, &e) || e.Code != code || e.Reason != text {
			t.Errorf("%s: %v\nwant (%d) %q", what, err, code, text)
		}
		if conn.IsClosed() {
			conn, ch = dial(t, url)
			return
		}
		ch, _ = conn.Channel()
	}
	const defaultEx = "ACCESS_REFUSED - operation not permitted on the default exchange"
	check("delete amq.direct", ch.ExchangeDelete("amq.direct", false, false), 403,
		"ACCESS_REFUSED - deletion of system exchange 'amq.direct' in vhost '/' not allowed")
	check("delete the default exchange", ch.ExchangeDelete("", false, false), 403, defaultEx)
	if _, err := ch.QueueDeclare("r.q", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	check("bind to the default exchange", ch.QueueBind("r.q", "k", "", false, nil), 403, defaultEx)
	check("unbind from the default exchange", ch.QueueUnbind("r.q", "k", "", nil), 403, defaultEx)
	check("bind an exchange to the default one", ch.ExchangeBind("amq.direct", "k", "", false, nil), 403, defaultEx)
	check("declare amq.foo", ch.ExchangeDeclare("amq.foo", "direct", false, false, false, false, nil), 403,
		"ACCESS_REFUSED - exchange name 'amq.foo' contains reserved prefix 'amq.*'")
	_, err := ch.QueueDeclare("amq.foo", false, true, false, false, nil)
	check("declare queue amq.foo", err, 403, "ACCESS_REFUSED - queue name 'amq.foo' contains reserved prefix 'amq.*'")
	_, err = ch.QueueDeclarePassive("", false, false, false, false, nil)
	check("passive declare of ''", err, 404, "NOT_FOUND - no queue '' in vhost '/'")

	if _, err := ch.QueueDeclare("r.full", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "r.full", amqp091.Publishing{Body: []byte("x")})
	_, err = ch.QueueDelete("r.full", false, true, false)
	check("delete if-empty", err, 406, "PRECONDITION_FAILED - queue 'r.full' in vhost '/' not empty")
	if _, err := ch.QueueDeclare("r.used", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	consCh, _ := conn.Channel()
	if _, err := consCh.Consume("r.used", "a", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDelete("r.used", true, false, false)
	check("delete if-unused", err, 406, "PRECONDITION_FAILED - queue 'r.used' in vhost '/' in use")
	_, err = ch.Consume("r.used", "b", false, true, false, false, nil)
	check("exclusive consume of a queue in use", err, 403, "ACCESS_REFUSED - queue 'r.used' in vhost '/' in exclusive use")
	if _, err := ch.QueueDeclare("r.ec", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := consCh.Consume("r.ec", "x", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	_, err = ch.Consume("r.ec", "y", false, false, false, false, nil)
	check("consume beside an exclusive consumer", err, 403, "ACCESS_REFUSED - queue 'r.ec' in vhost '/' in exclusive use")

	if err := ch.ExchangeDeclare("r.bx", "direct", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind("r.q", "k", "r.bx", false, nil); err != nil {
		t.Fatal(err)
	}
	check("exchange delete if-unused", ch.ExchangeDelete("r.bx", true, false), 406,
		"PRECONDITION_FAILED - exchange 'r.bx' in vhost '/' in use")

	if _, err := ch.QueueDeclare("r.excl", false, true, true, false, nil); err != nil {
		t.Fatal(err)
	}
	_, other := dial(t, url)
	check("bind another connection's exclusive queue", other.QueueBind("r.excl", "k", "amq.direct", false, nil), 405,
		"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue 'r.excl' in vhost '/'. It could be originally declared on another connection or the exclusive property value does not match that of the original declaration.")

	// A bind's 404s name the missing exchange or queue in RabbitMQ's
	// words, the source first when both are missing (found by the
	// differential test, make amqp-diff).
	check("bind to a missing exchange", ch.QueueBind("r.q", "k", "r.nox", false, nil), 404,
		"NOT_FOUND - no exchange 'r.nox' in vhost '/'")
	check("bind a missing queue", ch.QueueBind("r.noq", "k", "amq.direct", false, nil), 404,
		"NOT_FOUND - no queue 'r.noq' in vhost '/'")
	check("bind a missing queue to a missing exchange", ch.QueueBind("r.noq", "k", "r.nox", false, nil), 404,
		"NOT_FOUND - no exchange 'r.nox' in vhost '/'")
	check("bind a missing exchange", ch.ExchangeBind("r.nox", "k", "amq.direct", false, nil), 404,
		"NOT_FOUND - no exchange 'r.nox' in vhost '/'")
	check("bind from a missing exchange", ch.ExchangeBind("amq.direct", "k", "r.nox", false, nil), 404,
		"NOT_FOUND - no exchange 'r.nox' in vhost '/'")

	check("channel.flow active=false", ch.Flow(false), 540, "NOT_IMPLEMENTED - active=false")
}

// A basic.get with no-ack takes one message and leaves the next one as it
// was: not delivered, so not redelivered (the get's consumer was handed
// the next one as the ack freed its prefetch, and its cancel requeued it,
// counted as a delivery).
func TestGetNoAckLeavesTheNextUndelivered(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("g", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"0", "1", "2"} {
		publishConfirmed(t, ch, "", "g", amqp091.Publishing{Body: []byte(b)})
	}
	for i, want := range []string{"0", "1", "2"} {
		m, ok, err := ch.Get("g", true)
		if err != nil || !ok || string(m.Body) != want || m.Redelivered || m.Headers["x-delivery-count"] != nil || int(m.MessageCount) != 2-i {
			t.Fatalf("get %d: %v %v body %q redelivered=%v headers %v count %d; want %q, not redelivered, %d left",
				i, ok, err, m.Body, m.Redelivered, m.Headers, m.MessageCount, want, 2-i)
		}
	}
}

// What a basic.get took and the channel did not ack goes back to the
// queue when the channel closes (it stayed out until the connection
// closed), also when its ack was held by an uncommitted transaction.
func TestGetUnackedReturnsOnChannelClose(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	if _, err := ch.QueueDeclare("gc", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	publishConfirmed(t, ch, "", "gc", amqp091.Publishing{Body: []byte("x")})
	for _, tx := range []bool{false, true} {
		other, err := conn.Channel()
		if err != nil {
			t.Fatal(err)
		}
		m, ok, err := other.Get("gc", false)
		if err != nil || !ok {
			t.Fatalf("get (tx=%v): %v %v", tx, ok, err)
		}
		if tx {
			if err := other.Tx(); err != nil {
				t.Fatal(err)
			}
			if err := m.Ack(false); err != nil {
				t.Fatal(err)
			}
		}
		if err := other.Close(); err != nil {
			t.Fatal(err)
		}
		m, ok, err = ch.Get("gc", false)
		if err != nil || !ok || !m.Redelivered {
			t.Fatalf("get after the channel closed (tx=%v): %v %v redelivered=%v; want the message back, redelivered", tx, ok, err, m.Redelivered)
		}
		if err := m.Reject(true); err != nil {
			t.Fatal(err)
		}
	}
}

// A publish's user-id must be the connection's user, as RabbitMQ checks
// it (consumers may trust it).
func TestPublishUserIDIsChecked(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	_, ch := dial(t, url)
	if _, err := ch.QueueDeclare("u", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if c := publishConfirmed(t, ch, "", "u", amqp091.Publishing{UserId: "guest", Body: []byte("x")}); !c.Ack {
		t.Fatalf("user-id guest: %+v", c)
	}
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.PublishWithContext(context.Background(), "", "u", false, false, amqp091.Publishing{UserId: "mallory", Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		if want := "PRECONDITION_FAILED - user_id property set to 'mallory' but authenticated user was 'guest'"; e == nil || e.Code != 406 || e.Reason != want {
			t.Fatalf("user-id mallory: %v, want (406) %q", e, want)
		}
	case <-time.After(deadline):
		t.Fatal("a publish with another user's user-id was taken")
	}
}

// TestCrossedChannelClose: a client's channel.close that crosses the
// broker's (here the broker closes the channel for an ack of an unknown
// tag) is answered with close-ok, and the channel is free again only at
// the client's close-ok to the broker's close, as RabbitMQ has it. Before,
// the client's close freed the channel, and the close-ok behind it closed
// the connection with 504 (amqp091-go sends exactly this when an
// application closes a channel the broker is closing).
func TestCrossedChannelClose(t *testing.T) {
	_, l, _ := start(t, amqp.Config{})
	nc := rawConn(t, l.Addr().String())
	writeFrame(t, nc, 1, 1, []byte{0, 20, 0, 10, 0}) // channel.open
	if cm := readMethod(t, nc); cm != [2]uint16{20, 11} {
		t.Fatalf("want channel.open-ok, got %v", cm)
	}
	ack := []byte{0, 60, 0, 80, 0, 0, 0, 0, 0, 0, 0, 99, 0} // basic.ack tag 99
	writeFrame(t, nc, 1, 1, ack)
	writeFrame(t, nc, 1, 1, []byte{0, 20, 0, 40, 0, 200, 0, 0, 0, 0, 0}) // the client's channel.close, crossing
	cm, p := readMethodPayload(t, nc)
	if cm != [2]uint16{20, 40} || binary.BigEndian.Uint16(p) != 406 {
		t.Fatalf("want channel.close 406, got %v %x", cm, p)
	}
	if cm := readMethod(t, nc); cm != [2]uint16{20, 41} {
		t.Fatalf("want channel.close-ok to the client's close, got %v", cm)
	}
	writeFrame(t, nc, 1, 1, []byte{0, 20, 0, 41})    // close-ok to the broker's close
	writeFrame(t, nc, 1, 1, []byte{0, 20, 0, 10, 0}) // the channel again
	if cm := readMethod(t, nc); cm != [2]uint16{20, 11} {
		t.Fatalf("want channel.open-ok on the reused channel, got %v", cm)
	}
}
