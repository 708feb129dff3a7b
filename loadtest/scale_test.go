package loadtest

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/warren-mq/warren/netio"
	"github.com/warren-mq/warren/netio/warrentest"
)

func TestParseProcStatusRSS(t *testing.T) {
	rss, anon, err := parseProcStatusRSS([]byte("Name:\twarrend\nVmRSS:\t   20480 kB\nRssAnon:\t    8192 kB\nRssFile:\t 12288 kB\n"))
	if err != nil || rss != 20480<<10 || anon != 8192<<10 {
		t.Fatalf("got %d %d %v", rss, anon, err)
	}
	for _, bad := range []string{"VmRSS:\t1 kB\n", "VmRSS:\t1 MB\nRssAnon:\t1 kB\n", "VmRSS:\tx kB\nRssAnon:\t1 kB\n"} {
		if _, _, err := parseProcStatusRSS([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, _, err := ProcRSS(os.Getpid()); err != nil {
		t.Fatal(err)
	}
}

// inProc holds idle connections in this process (the command line starts
// processes of their own).
type inProc struct{ s *IdleSet }

func (p inProc) Pid() int { return os.Getpid() }

func (p inProc) Stop() (int, error) {
	n, _ := p.s.Lost()
	p.s.Close()
	return n, nil
}

// A scaled-down scale-idle: two rounds of the pair beside and then without
// the idle connections, and the broker's memory read around their first
// opening.
func TestScaleIdleSmall(t *testing.T) {
	s := warrentest.StartServer(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	url := warrentest.URL(s)
	opened := 0
	cfg := ScaleIdleConfig{
		Pair: Config{URL: url, Count: 3000, Scenario: "pair"},
		Idle: 41, Procs: 2, BrokerPID: os.Getpid(), Settle: time.Millisecond,
		StartIdle: func(ctx context.Context, n int) (IdleProc, error) {
			set, err := OpenIdle(ctx, IdleOptions{URL: url, Conns: n, Channels: 1, Parallel: 8})
			if err != nil {
				return nil, err
			}
			opened += set.Len()
			return inProc{set}, nil
		},
	}
	var out bytes.Buffer
	rep, err := ScaleIdle(ctx, cfg, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if opened != 2*41 {
		t.Fatalf("opened %d idle connections, want 41 in each of 2 rounds", opened)
	}
	var with []bool
	for _, r := range rep.Runs {
		with = append(with, r.WithIdle)
		if r.ConsumeRate <= 0 || r.Lost != 0 {
			t.Errorf("pair run %+v", r)
		}
	}
	if len(with) != 4 || !with[0] || with[1] || !with[2] || with[3] {
		t.Fatalf("runs with idle connections open: %v, want true false true false", with)
	}
	if rep.RSSBefore <= 0 || rep.RSSAfter <= 0 || rep.AnonAfter <= 0 || rep.IdleLost != 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, want := range []string{"per idle connection", "| 1 | 41 |", "with / without"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// A broker that refuses some of the connections fails OpenIdle with its
// reason.
func TestOpenIdleRefused(t *testing.T) {
	s := warrentest.StartServer(t, &netio.Config{MaxConnections: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := OpenIdle(ctx, IdleOptions{URL: warrentest.URL(s), Conns: 5, Parallel: 1})
	if err == nil || !strings.Contains(err.Error(), "max_connections") {
		t.Fatalf("got %v, want the broker's max_connections refusal", err)
	}
}
