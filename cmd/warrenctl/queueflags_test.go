package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/warren-mq/warren/wire"
)

// TestQueueDeclareFlags: queue declare has a flag for every queue argument
// (wire's descriptor table), each sets that argument, and help lists it.
func TestQueueDeclareFlags(t *testing.T) {
	t.Parallel()
	c := newCtl(t, nil)
	help, _, _ := c.run("", "help")
	for i, d := range wire.QueueArgDescs() {
		name := "q" + strconv.Itoa(i)
		var args []string
		var want any
		switch d.Kind {
		case wire.ArgInt, wire.ArgMillis:
			n := d.Min + 1
			if len(d.Enum) > 0 {
				n, _ = strconv.ParseInt(d.Enum[len(d.Enum)-1], 10, 64)
			}
			if d.Kind == wire.ArgMillis {
				// An hour: expires at 2 ms deleted the queue before
				// queue show read it on a loaded machine (CI).
				n = max(n, 3_600_000)
			}
			args, want = []string{"--" + d.Flag, strconv.FormatInt(n, 10)}, float64(n)
		case wire.ArgNumber:
			args, want = []string{"--" + d.Flag, "2.5"}, 2.5
		case wire.ArgBool:
			args, want = []string{"--" + d.Flag}, true
		case wire.ArgString:
			args, want = []string{"--" + d.Flag, "x"}, "x"
		case wire.ArgEnum:
			args, want = []string{"--" + d.Flag, d.Enum[0]}, d.Enum[0]
		}
		if _, errs, code := c.run("", append([]string{"queue", "declare", name}, args...)...); code != 0 {
			t.Errorf("queue declare %v (argument %s): exit %d: %s", args, d.Key, code, errs)
			continue
		}
		if got := c.queueJSON(name)[d.JSON]; got != want {
			t.Errorf("queue declare %v: %s = %v, want %v", args, d.JSON, got, want)
		}
		if !strings.Contains(help, "--"+d.Flag+" ") && !strings.Contains(help, "--"+d.Flag+"\n") {
			t.Errorf("help does not list --%s", d.Flag)
		}
	}
}
