package broker

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestQueueNamesForOperators: a queue is named for an operator (logs,
// errors that are not a client's) one way: queue "q" in vhost "/" in
// text, vhost=/ queue=q in a log line; a list of them names each vhost
// once. Never "//q" (vhost + "/" + name) nor the internal name with its
// separator.
func TestQueueNamesForOperators(t *testing.T) {
	v := QualifyName("v", "q")
	for _, tc := range []struct{ internal, text, log string }{
		{"q", `queue "q" in vhost "/"`, "vhost=/ queue=q"},
		{v, `queue "q" in vhost "v"`, "vhost=v queue=q"},
	} {
		if got := QueueText(tc.internal); got != tc.text {
			t.Errorf("QueueText(%q) = %s, want %s", tc.internal, got, tc.text)
		}
		var buf bytes.Buffer
		slog.New(slog.NewTextHandler(&buf, nil)).Info("m", queueLog(tc.internal), "group", 7)
		if got := buf.String(); !strings.Contains(got, " "+tc.log+" group=7") {
			t.Errorf("queueLog(%q) logs %q, want %s", tc.internal, got, tc.log)
		}
	}
	names := []string{QualifyName("v", "c"), "b", "a", QualifyName("w", "d"), QualifyName("v", "e")}
	if got, want := queueList(names, 4), `queues "a", "b" in vhost "/"; queues "c", "e" in vhost "v" and 1 more`; got != want {
		t.Errorf("queueList = %s, want %s", got, want)
	}
	if got, want := queueList([]string{"a"}, 4), `queue "a" in vhost "/"`; got != want {
		t.Errorf("queueList of one = %s, want %s", got, want)
	}
}
