package amqp_test

import (
	"errors"
	"testing"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/amqp"
)

// TestQueueDeleteWithMetaLog: with a data directory, queue.delete (held
// in its own control run until the deletion is on disk: the broker's
// TestMetaLogDeleteAnsweredAfterDurable holds the fsync) still answers
// the count of messages the queue held, and a no-wait delete is done
// before the next method on the channel (a passive declare of the queue
// then finds nothing). It checks the held answer, not the wait.
func TestQueueDeleteWithMetaLog(t *testing.T) {
	srv, _, url := startWith(t, netio.Config{DataDir: t.TempDir()}, amqp.Config{})
	_, ch := dial(t, url)
	for _, name := range []string{"d.counted", "d.nowait"} {
		if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		publishConfirmed(t, ch, "", "d.counted", amqp091.Publishing{DeliveryMode: amqp091.Persistent, Body: []byte("x")}) // confirmed once applied
	}
	n, err := ch.QueueDelete("d.counted", false, false, false)
	if err != nil || n != 2 {
		t.Fatalf("delete: %d messages, %v; want 2", n, err)
	}
	if srv.Broker.LookupQueue("d.counted") != nil {
		t.Fatal("queue d.counted still there after its delete-ok")
	}
	if _, err := ch.QueueDelete("d.nowait", false, false, true); err != nil {
		t.Fatal(err)
	}
	_, err = ch.QueueDeclarePassive("d.nowait", true, false, false, false, nil)
	var e *amqp091.Error
	if !errors.As(err, &e) || e.Code != 404 {
		t.Fatalf("passive declare after a no-wait delete: %v, want 404", err)
	}
}
