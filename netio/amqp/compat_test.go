package amqp_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio/amqp"
)

// pikaPython is the Python with pika (python3-pika), or "" if there is
// none; WARREN_REQUIRE_PIKA=1 (CI, which installs it) makes its absence a
// failure instead of a skip.
func pikaPython(t *testing.T) string {
	py := os.Getenv("PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	if err := exec.Command(py, "-c", "import pika").Run(); err != nil {
		if os.Getenv("WARREN_REQUIRE_PIKA") == "1" {
			t.Fatalf("%s cannot import pika (%v): apt-get install python3-pika", py, err)
		}
		t.Skipf("%s cannot import pika (%v): apt-get install python3-pika to run it", py, err)
	}
	return py
}

// The short version of make amqp-compat: a real third-party client, pika,
// through declare, bind, publish with confirms, mandatory returns,
// consume, ack, nack, reject, get, dead-lettering, priorities, recover,
// global prefetch, refusals and transactions (compat/pika_compat.py).
func TestPikaCompat(t *testing.T) {
	t.Parallel() // its own broker; the 0.5 s each spends stopping it overlaps
	py := pikaPython(t)
	_, _, url := start(t, amqp.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, py, "compat/pika_compat.py", url).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "checks passed") {
		t.Fatalf("pika_compat.py: %v\n%s", err, out)
	}
	t.Logf("%s", out)
}
