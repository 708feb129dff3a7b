package admin_test

import (
	"strings"
	"testing"
)

// TestQueueSettingErrors: a queue setting of the wrong JSON type or out of
// range is refused with a message in the admin API's own terms: it names
// the JSON setting (max_priority, not the protocol's max-priority) and
// what it takes (from wire's descriptor table), and no Go type names.
func TestQueueSettingErrors(t *testing.T) {
	e := setup(t)
	for _, c := range []struct{ body, want string }{
		{`{"max_priority":"high"}`, "queue setting max_priority: want an int in [1, 255]"},
		{`{"max_priority":1.5}`, "queue setting max_priority: want an int in [1, 255]"},
		{`{"max_priority":300}`, "queue setting max_priority: want an int in [1, 255]"},
		{`{"overflow":3}`, "queue setting overflow: want drop-head, reject-publish, reject-publish-dlx or dead-letter"},
		{`{"overflow":"explode"}`, "queue setting overflow: want drop-head, reject-publish, reject-publish-dlx or dead-letter"},
		{`{"message_ttl_ms":-1}`, "queue setting message_ttl_ms: want an int in [0, 9223372036854]"},
		{`{"retry_multiplier":"2"}`, "queue setting retry_multiplier: want a number in [1, 1000]"},
		{`{"single_active_consumer":1}`, "queue setting single_active_consumer: want a bool"},
		{`{"replicas":2}`, "queue setting replicas: want 1, 3 or 5"},
		{`{"durable":"yes"}`, "bad request body: durable: want true or false, not string"},
	} {
		var eb struct {
			Error struct{ Name, Message string }
		}
		st := e.do("PUT", "/api/queues/q", c.body, &eb)
		if st != 400 || eb.Error.Name != "invalid_argument" || eb.Error.Message != c.want {
			t.Errorf("%s: %d %s %q, want 400 invalid_argument %q", c.body, st, eb.Error.Name, eb.Error.Message, c.want)
		}
		if strings.Contains(eb.Error.Message, "Go ") {
			t.Errorf("%s: the message names Go types: %q", c.body, eb.Error.Message)
		}
	}
}
