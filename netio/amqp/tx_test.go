package amqp_test

import (
	"context"
	"errors"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/warren-mq/warren/netio/amqp"
)

// tx.select, then publishes and acks are held until tx.commit and dropped
// by tx.rollback, as RabbitMQ does (amqp091-go's TxCommit and TxRollback
// integration tests are the same calls).
func TestTransactions(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{})
	conn, ch := dial(t, url)
	other, _ := conn.Channel() // outside the transaction
	if _, err := ch.QueueDeclare("txq", false, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	ready := func() int {
		t.Helper()
		q, err := other.QueueDeclarePassive("txq", false, false, false, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q.Messages
	}
	if err := ch.Tx(); err != nil {
		t.Fatalf("tx.select: %v", err)
	}
	pub := func(body string) {
		t.Helper()
		if err := ch.PublishWithContext(context.Background(), "", "txq", false, false, amqp091.Publishing{Body: []byte(body)}); err != nil {
			t.Fatal(err)
		}
	}
	pub("1")
	pub("2")
	if n := ready(); n != 0 {
		t.Fatalf("%d messages in the queue before tx.commit, want 0", n)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatalf("tx.commit: %v", err)
	}
	if n := ready(); n != 2 {
		t.Fatalf("%d messages after tx.commit, want 2", n)
	}
	pub("3")
	if err := ch.TxRollback(); err != nil {
		t.Fatalf("tx.rollback: %v", err)
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	if n := ready(); n != 2 {
		t.Fatalf("%d messages after a rolled back publish, want 2", n)
	}
	// An ack is held too: rolled back, its message goes back to the queue.
	m, ok, err := ch.Get("txq", false)
	if err != nil || !ok || string(m.Body) != "1" {
		t.Fatalf("get: %v %v %q", ok, err, m.Body)
	}
	if err := m.Ack(false); err != nil {
		t.Fatal(err)
	}
	if err := ch.TxRollback(); err != nil {
		t.Fatal(err)
	}
	if n := ready(); n != 2 {
		t.Fatalf("%d messages after a rolled back ack, want 2 (it is back)", n)
	}
	for i := 0; i < 2; i++ {
		m, ok, err := ch.Get("txq", false)
		if err != nil || !ok {
			t.Fatalf("get %d: %v %v", i, ok, err)
		}
		if err := m.Ack(false); err != nil {
			t.Fatal(err)
		}
	}
	if err := ch.TxCommit(); err != nil {
		t.Fatal(err)
	}
	if n, err := other.QueuePurge("txq", false); err != nil || n != 0 {
		t.Fatalf("purge after the acks' commit: %d, %v; want 0 (both acked)", n, err)
	}
}

// Confirm and tx modes exclude each other; commit and rollback need
// tx.select; what a transaction holds is bounded.
func TestTransactionRefusals(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	_, _, url := start(t, amqp.Config{MaxUnconfirmed: 3})
	conn, ch := dial(t, url)
	check := func(err error, code int, text string) {
		t.Helper()
		var e *amqp091.Error
		if !errors.As(err, &e) || e.Code != code || e.Reason != text {
			t.Errorf("%v\nwant (%d) %q", err, code, text)
		}
		ch, _ = conn.Channel()
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	check(ch.Tx(), 406, "PRECONDITION_FAILED - cannot switch from confirm to tx mode")
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	check(ch.Confirm(false), 406, "PRECONDITION_FAILED - cannot switch from tx to confirm mode")
	check(ch.TxCommit(), 406, "PRECONDITION_FAILED - channel is not transactional")
	if _, err := ch.QueueDeclare("big", false, true, false, false, nil); err != nil {
		t.Fatal(err)
	}
	closed := ch.NotifyClose(make(chan *amqp091.Error, 1))
	if err := ch.Tx(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		_ = ch.PublishWithContext(context.Background(), "", "big", false, false, amqp091.Publishing{Body: []byte("x")})
	}
	select {
	case e := <-closed:
		if e == nil || e.Code != 406 {
			t.Fatalf("a fourth held publish at MaxUnconfirmed 3: %v, want 406", e)
		}
	case <-time.After(deadline):
		t.Fatal("a fourth held publish at MaxUnconfirmed 3 was taken")
	}
}
